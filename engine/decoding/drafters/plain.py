"""Plain decoding through the speculative loop: every round verifies zero draft tokens."""

from __future__ import annotations

from engine.decoding.drafters.base import Draft, Drafter, empty_draft


class NoDrafter(Drafter):
    """Plain decoding through the same loop: every round verifies zero draft tokens."""

    def __init__(self, vocab_size: int, device):
        self.vocab_size, self.device = vocab_size, device

    def propose(self, context: list[int], k: int) -> Draft:
        return empty_draft(self.vocab_size, self.device)
