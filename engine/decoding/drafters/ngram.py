"""Prompt lookup: continue the context from an earlier occurrence of its last few tokens."""

from __future__ import annotations

import torch

from engine.decoding.drafters.base import Draft, Lookahead, empty_draft, match_bucket
from engine.decoding.sampling import one_hot
from engine.settings import SamplingSettings

# how far back a match is followed to measure its length (the condition adaptive K uses)
MAX_MATCH_LENGTH = 16
EARLIER_KEPT = 3  # earlier occurrences per n-gram kept as a tree's other branches


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens
    (n from ngram_max down to ngram_min) and propose the tokens that followed it.
    A Drafter that begins requests, looks ahead and proposes trees."""

    name = "ngram"

    def __init__(self, vocab_size: int, device, ngram_min: int = 1, ngram_max: int = 3):
        self.vocab_size, self.device = vocab_size, device
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.sampling = SamplingSettings()
        self.reset()

    def begin(self, sampling, generator, cancel=None, p_min=0.0, noise=None) -> None:
        self.sampling = sampling  # a one-hot draft's distribution is needed only when sampling

    def update(self, accepted: list[int]) -> None:
        """Nothing to do: the next proposal indexes the context it is given."""

    def reset(self) -> None:
        self._seen: list[int] = []  # the context already indexed
        # n-gram -> index of the token after its latest occurrence
        self._latest: dict[tuple[int, ...], int] = {}
        # n-gram -> followers of earlier occurrences that continued with another token, newest first
        self._earlier: dict[tuple[int, ...], list[int]] = {}

    def peek(self, context: list[int]) -> Lookahead:
        """The match's length (how many tokens before the follower agree with the context's end)
        and how many tokens follow it."""
        follower = self._match(context)
        if follower is None:
            return Lookahead(condition=0, available=0)
        length = 0
        while (
            length < min(MAX_MATCH_LENGTH, follower)
            and context[follower - 1 - length] == context[-1 - length]
        ):
            length += 1
        return Lookahead(condition=match_bucket(length), available=len(context) - follower)

    def propose(self, context: list[int], k: int) -> Draft:
        follower = self._match(context)
        if follower is None:
            return empty_draft(self.vocab_size, self.device)
        tokens = torch.tensor(context[follower : follower + k], dtype=torch.long, device=self.device)
        return Draft(tokens, None if self.sampling.greedy else one_hot(tokens, self.vocab_size))

    def tree(self, context: list[int], draft: list[int], budget: int):
        """The draft, plus what followed the match's earlier occurrences where that differs."""
        from engine.decoding.tree import DraftTree

        key = self._matched_key(context)
        if not draft or key is None or budget <= len(draft):
            return None
        tree = DraftTree.chain(draft)
        for follower in self._earlier.get(key, ()):
            tree.add_branch(context[follower : follower + len(draft)], -1, budget)
        return tree if len(tree) > len(draft) else None

    def _match(self, context: list[int]) -> int | None:
        key = self._matched_key(context)
        return None if key is None else self._latest[key]

    def _matched_key(self, context: list[int]) -> tuple[int, ...] | None:
        self._index(context)
        for n in range(min(self.ngram_max, len(context) - 1), self.ngram_min - 1, -1):
            key = tuple(context[-n:])
            if key in self._latest:
                return key
        return None

    def _index(self, context: list[int]) -> None:
        """Indexes every n-gram of `context` that has a following token (so not the context's own suffix)."""
        if len(context) < len(self._seen) or context[: len(self._seen)] != self._seen:
            self.reset()
        for follower in range(max(len(self._seen), 1), len(context)):
            for n in range(self.ngram_min, min(self.ngram_max, follower) + 1):
                key = tuple(context[follower - n : follower])
                latest = self._latest.get(key)
                if latest is not None and context[latest] != context[follower]:
                    # an earlier occurrence that went on differently: a tree's other branch
                    earlier = [
                        latest,
                        *(f for f in self._earlier.get(key, ()) if context[f] != context[latest]),
                    ]
                    self._earlier[key] = earlier[:EARLIER_KEPT]
                self._latest[key] = follower
        self._seen = list(context)
