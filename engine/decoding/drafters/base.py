"""Drafters propose the next few tokens cheaply; the target then verifies them in one forward.

Every drafter has the same two calls:
  propose(context, k) -> Draft   up to k tokens that may follow `context`, with the distributions
                                 they were drawn from (one-hot for a deterministic drafter);
  update(accepted)               the draft tokens the target kept, so a drafter with a cache can
                                 drop the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
