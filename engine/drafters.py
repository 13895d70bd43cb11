"""Drafters propose the next few tokens cheaply; the target then verifies them in one forward.

Every drafter has the same two calls:
  propose(context, k) -> Draft   up to k tokens that may follow `context`, with the distributions
                                 they were drawn from (one-hot for a deterministic drafter);
  update(accepted)               the draft tokens the target kept, so a drafter with a cache can
                                 drop the rest.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from engine.runner import ModelRunner
from engine.sampling import one_hot, probs_from_logits, sample
from engine.settings import SamplingSettings


class Cancelled(Exception):
    """Raised inside a round when the user cancels; the loop catches it."""


@dataclass
class Draft:
    tokens: torch.Tensor  # [k] long, on the target's device
    probs: torch.Tensor | None  # [k, V] float32: the distribution each token was drawn from; None when greedy

    def __len__(self) -> int:
        return int(self.tokens.size(0))


class Drafter:
    name = "none"
    # forwards a round costs besides the target's; zero for drafters without a model
    has_model = False
    sampling = SamplingSettings()
    # seconds the last proposal spent reading tokens the drafter had skipped (after plain rounds);
    # a one-off cost that must not count as the per-token price of drafting
    catch_up_s = 0.0

    def begin(
        self, sampling: SamplingSettings, generator: torch.Generator | None, cancel=None, p_min=0.0
    ) -> None:
        """A new request starts: its sampling settings, random generator and cancel flag."""
        self.sampling = sampling

    def propose(self, context: list[int], k: int) -> Draft:
        raise NotImplementedError

    def update(self, accepted: list[int]) -> None:
        """`accepted`: the draft tokens the target kept in the last round (a prefix of the draft)."""

    def prefill(self, context: list[int]) -> None:
        """Reads a new prompt before the first round, so that its cost is not charged to drafting."""

    def reset(self) -> None:
        """Forget everything about earlier requests."""


def empty_draft(vocab_size: int, device) -> Draft:
    return Draft(torch.zeros(0, dtype=torch.long, device=device), torch.zeros((0, vocab_size), device=device))


class NoDrafter(Drafter):
    """Plain decoding through the same loop: every round verifies zero draft tokens."""

    def __init__(self, vocab_size: int, device):
        self.vocab_size, self.device = vocab_size, device

    def propose(self, context: list[int], k: int) -> Draft:
        return empty_draft(self.vocab_size, self.device)


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens
    (n from ngram_max down to ngram_min) and propose the tokens that followed it."""

    name = "ngram"

    def __init__(self, vocab_size: int, device, ngram_min: int = 1, ngram_max: int = 3):
        self.vocab_size, self.device = vocab_size, device
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.reset()

    def reset(self) -> None:
        self._seen: list[int] = []  # the context already indexed
        self._latest: dict[
            tuple[int, ...], int
        ] = {}  # n-gram -> index of the token after its latest occurrence

    def propose(self, context: list[int], k: int) -> Draft:
        self._index(context)
        for n in range(min(self.ngram_max, len(context) - 1), self.ngram_min - 1, -1):
            follower = self._latest.get(tuple(context[-n:]))
            if follower is not None:
                tokens = torch.tensor(context[follower : follower + k], dtype=torch.long, device=self.device)
                return Draft(tokens, None if self.sampling.greedy else one_hot(tokens, self.vocab_size))
        return empty_draft(self.vocab_size, self.device)

    def _index(self, context: list[int]) -> None:
        """Indexes every n-gram of `context` that has a following token (so not the context's own suffix)."""
        if context[: len(self._seen)] != self._seen:
            self.reset()
        for follower in range(max(len(self._seen), 1), len(context)):
            for n in range(self.ngram_min, min(self.ngram_max, follower) + 1):
                self._latest[tuple(context[follower - n : follower])] = follower
        self._seen = list(context)


class ModelDrafter(Drafter):
    """A smaller causal LM (possibly quantized) with its own KV cache, sampling with the target's warpers."""

    has_model = True

    def __init__(self, runner: ModelRunner, target_vocab_size: int, name: str = "draft"):
        self.runner = runner
        self.target_vocab_size = target_vocab_size
        self.name = f"model:{name}"
        self.cached_tokens: list[int] = []  # a prefix of what the runner's cache holds
        self._pending: tuple[list[int], int] | None = None  # (context, k) of the last proposal
        self.begin(SamplingSettings(), None)

    def begin(self, sampling, generator, cancel: threading.Event | None = None, p_min: float = 0.0) -> None:
        self.sampling, self.generator, self.cancel, self.p_min = sampling, generator, cancel, p_min
        self._pending = None

    def reset(self) -> None:
        self.runner.reset()
        self.cached_tokens = []

    def propose(self, context: list[int], k: int) -> Draft:
        k = min(k, self.runner.context_length - len(context))
        if k <= 0:
            return empty_draft(self.target_vocab_size, self.runner.device)
        logits = self._catch_up(context)  # [V_draft]
        tokens, probs = [], []
        for i in range(k):
            if self.p_min > 0 and self._confidence(logits) < self.p_min:
                break
            if self.sampling.greedy:
                token = logits[: self.target_vocab_size].argmax()  # []
            else:
                draft_probs = self._target_width(probs_from_logits(logits, self.sampling))  # [V]
                token = sample(draft_probs, self.generator)  # []
                probs.append(draft_probs)
            tokens.append(token)
            if i + 1 < k:
                self._check_cancel()
                logits = self.runner.forward(token.view(1))[-1]
        self._pending = (context, len(tokens))
        if not tokens:
            return empty_draft(self.target_vocab_size, self.runner.device)
        return Draft(torch.stack(tokens), torch.stack(probs) if probs else None)

    def prefill(self, context: list[int]) -> None:
        if len(context) > 1:
            self._catch_up(context)

    def update(self, accepted: list[int]) -> None:
        """The cache holds context + draft[:k-1]; keep context + the accepted part of that."""
        if self._pending is None:
            return
        context, k = self._pending
        self._pending = None
        kept = context + accepted[: max(k - 1, 0)]
        self.runner.rollback(len(kept))
        self.cached_tokens = kept

    def _catch_up(self, context: list[int]) -> torch.Tensor:
        """Bring the cache to exactly `context` (reusing the longest common prefix); the last logits: [V]."""
        keep = min(
            common_prefix_length(self.cached_tokens, context), len(context) - 1, self.runner.cache_length
        )
        self.runner.rollback(keep)
        self._check_cancel()
        started = time.perf_counter()
        logits = self.runner.prefill(context[keep:])
        # A round's catch-up reads at most the last accepted token and the target's own token; more
        # means the drafter sat out plain rounds (or is reading a new prompt).
        if len(context) - keep > 2:
            self.runner.synchronize()
            self.catch_up_s += time.perf_counter() - started
        self.cached_tokens = list(context)
        return logits

    def _target_width(self, probs: torch.Tensor) -> torch.Tensor:
        """Pads or cuts the draft vocabulary to the target's (they may differ by padding rows)."""
        extra = self.target_vocab_size - probs.size(-1)
        if extra > 0:
            return torch.nn.functional.pad(probs, (0, extra))
        return probs[..., : self.target_vocab_size] if extra < 0 else probs

    def _confidence(self, logits: torch.Tensor) -> float:
        """The draft's top probability (after the warpers when sampling)."""
        probs = logits.softmax(-1) if self.sampling.greedy else probs_from_logits(logits, self.sampling)
        return float(probs.max())  # a host sync per draft step, only when p_min is on

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
