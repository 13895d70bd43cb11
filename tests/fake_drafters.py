"""Drafters for tests that need one without a model. Each implements engine.decoding.drafters.base.Drafter
(and the capabilities it names) as the real drafters do; tests/test_contracts.py checks that they
still match the Protocols, so a fake cannot drift from the real thing."""

from __future__ import annotations

from engine.decoding.drafters.base import Draft, empty_draft


class EmptyDrafter:
    """A Drafter that proposes nothing: what a test needs where only the planner's side matters."""

    name = "empty"

    def propose(self, context: list[int], k: int) -> Draft:
        return empty_draft(1, "cpu")

    def update(self, accepted: list[int]) -> None:
        """Nothing to do: it keeps no cache."""

    def reset(self) -> None:
        """Nothing to forget."""


class ConfidentDrafter(EmptyDrafter):
    """An EmptyDrafter that stops by its confidence (StopsByConfidence), as a draft head does."""

    def __init__(self):
        self.stop_rule = None
        self.last_confidences: list[float] = []
