"""A suffix index over this conversation and earlier ones (in the spirit of SuffixDecoding and
llama.cpp's ngram-cache): chat users repeat themselves, and the model repeats itself across turns
and conversations.

Two frequency tables map an n-gram (n from n_min to n_max) to counts of the token that followed it:
  local   - the current context, indexed incrementally as it grows (rebuilt when it is replaced);
  history - earlier token sequences (finished replies, stored conversations), bounded to
            `max_entries` n-grams, the least recently updated dropped first, and at most
            `max_followers` counted followers per n-gram.
A draft walks forward: at each step it takes the longest n-gram ending the (context + draft so far)
that either table knows, and picks its most frequent follower (local counts weigh double: this
conversation predicts itself best). It stops when that follower's share of the counts falls below
`min_confidence`. The draft is deterministic (one-hot), so the accept/reject rule stays exact.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from engine.decoding.drafters.base import Draft, Lookahead, empty_draft, match_bucket
from engine.decoding.sampling import one_hot
from engine.settings import SamplingSettings

LOCAL_WEIGHT = 2.0


class SuffixDrafter:
    """A Drafter that begins requests, looks ahead and proposes trees."""

    name = "suffix"

    def __init__(
        self,
        vocab_size: int,
        device,
        history: list[list[int]] | None = None,
        n_min: int = 2,
        n_max: int = 8,
        max_entries: int = 200_000,
        max_followers: int = 4,
        min_confidence: float = 0.3,
        max_draft: int = 16,
    ):
        self.vocab_size, self.device = vocab_size, device
        self.n_min, self.n_max = n_min, n_max
        self.max_entries, self.max_followers = max_entries, max_followers
        self.min_confidence, self.max_draft = min_confidence, max_draft
        self.sampling = SamplingSettings()
        self._history: OrderedDict[tuple[int, ...], dict[int, float]] = OrderedDict()
        self.reset()
        for sequence in history or []:
            self.add_history(sequence)

    # --- the index --------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forgets the current conversation; the history stays."""
        self._seen: list[int] = []
        self._local: dict[tuple[int, ...], dict[int, float]] = {}
        self._peeked: tuple[tuple[int, int], list[int], int] | None = None

    def forget_history(self) -> None:
        self._history.clear()
        self._peeked = None

    def add_history(self, tokens: list[int], start: int = 0) -> None:
        """Indexes a finished sequence; only n-grams whose follower is at index >= `start` (so a reply
        can be passed with a few tokens of the prompt before it)."""
        self._peeked = None
        for follower in range(max(start, self.n_min), len(tokens)):
            for n in range(self.n_min, min(self.n_max, follower) + 1):
                key = tuple(tokens[follower - n : follower])
                followers = self._history.get(key)
                if followers is None:
                    followers = self._history[key] = {}
                    if len(self._history) > self.max_entries:
                        self._history.popitem(last=False)
                else:
                    self._history.move_to_end(key)
                _count(followers, tokens[follower], self.max_followers)

    @property
    def history_entries(self) -> int:
        return len(self._history)

    def _index(self, context: list[int]) -> None:
        if len(context) < len(self._seen) or context[: len(self._seen)] != self._seen:
            self.reset()
        for follower in range(max(len(self._seen), self.n_min), len(context)):
            for n in range(self.n_min, min(self.n_max, follower) + 1):
                key = tuple(context[follower - n : follower])
                _count(self._local.setdefault(key, {}), context[follower], self.max_followers)
        self._seen = list(context)

    # --- drafting ---------------------------------------------------------------------------------

    def begin(self, sampling, generator, cancel=None, p_min=0.0, noise=None) -> None:
        self.sampling = sampling  # a one-hot draft's distribution is needed only when sampling

    def update(self, accepted: list[int]) -> None:
        """Nothing to do: the next proposal indexes the context it is given."""

    def peek(self, context: list[int]) -> Lookahead:
        tokens, length = self._walk(context)
        return Lookahead(condition=match_bucket(length) if tokens else 0, available=len(tokens))

    def propose(self, context: list[int], k: int) -> Draft:
        tokens, _ = self._walk(context)
        if not tokens or k <= 0:
            return empty_draft(self.vocab_size, self.device)
        ids = torch.tensor(tokens[:k], dtype=torch.long, device=self.device)
        return Draft(ids, None if self.sampling.greedy else one_hot(ids, self.vocab_size))

    def _walk(self, context: list[int]) -> tuple[list[int], int]:
        """(draft tokens, the match length behind the first one); cached for the context last seen."""
        key = (len(context), context[-1] if context else -1)
        if self._peeked is not None and self._peeked[0] == key and self._seen == context:
            return self._peeked[1], self._peeked[2]
        self._index(context)
        sequence, tokens, first_length = list(context[-self.n_max :]), [], 0
        while len(tokens) < self.max_draft:
            best = self._next(sequence)
            if best is None:
                break
            token, confidence, length = best
            if confidence < self.min_confidence:
                break
            if not tokens:
                first_length = length
            tokens.append(token)
            sequence = sequence[1:] + [token] if len(sequence) >= self.n_max else sequence + [token]
        self._peeked = (key, tokens, first_length)
        return tokens, first_length

    def tree(self, context: list[int], draft: list[int], budget: int):
        """The draft, plus the other followers the index counts at its first step (each continued
        by the index's own walk), within `budget` nodes."""
        from engine.decoding.tree import DraftTree

        if not draft or budget <= len(draft):
            return None
        tree = DraftTree.chain(draft)
        start = list(context[-self.n_max :])
        for token, share in self._ranked(start)[1:]:
            if share < self.min_confidence / 2 or len(tree) >= budget:
                break
            branch, sequence = [token], (start + [token])[-self.n_max :]
            while len(branch) < len(draft):
                best = self._next(sequence)
                if best is None or best[1] < self.min_confidence:
                    break
                branch.append(best[0])
                sequence = (sequence + [best[0]])[-self.n_max :]
            tree.add_branch(branch, -1, budget)
        return tree if len(tree) > len(draft) else None

    def _ranked(self, sequence: list[int]) -> list[tuple[int, float]]:
        """Every follower of the longest known n-gram ending `sequence`, most frequent first: (token, share)."""
        for n in range(min(self.n_max, len(sequence)), self.n_min - 1, -1):
            scores = self._scores(tuple(sequence[-n:]))
            if scores:
                total = sum(scores.values())
                return sorted(((t, c / total) for t, c in scores.items()), key=lambda x: -x[1])
        return []

    def _scores(self, key: tuple[int, ...]) -> dict[int, float]:
        scores: dict[int, float] = {}
        for token, count in self._local.get(key, {}).items():
            scores[token] = scores.get(token, 0.0) + LOCAL_WEIGHT * count
        for token, count in self._history.get(key, {}).items():
            scores[token] = scores.get(token, 0.0) + count
        return scores

    def _next(self, sequence: list[int]) -> tuple[int, float, int] | None:
        """The most frequent follower of the longest known n-gram ending `sequence`: (token, share, n)."""
        for n in range(min(self.n_max, len(sequence)), self.n_min - 1, -1):
            key = tuple(sequence[-n:])
            local, history = self._local.get(key), self._history.get(key)
            if not local and not history:
                continue
            scores: dict[int, float] = {}
            for token, count in (local or {}).items():
                scores[token] = scores.get(token, 0.0) + LOCAL_WEIGHT * count
            for token, count in (history or {}).items():
                scores[token] = scores.get(token, 0.0) + count
            token = max(scores, key=scores.get)
            return token, scores[token] / sum(scores.values()), n
        return None


def _count(followers: dict[int, float], token: int, limit: int) -> None:
    """Counts one more `token`; when the followers are full, the least counted one makes room."""
    if token not in followers and len(followers) >= limit:
        del followers[min(followers, key=followers.get)]
    followers[token] = followers.get(token, 0.0) + 1.0
