"""Prompt lookup: continue the context from an earlier occurrence of its last few tokens."""

from __future__ import annotations

import torch

from engine.decoding.drafters.base import Draft, Drafter, empty_draft
from engine.decoding.sampling import one_hot


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
