"""Several drafters behind one name: each round, the planner (planner.DraftPlanner) lets the one
with the best expected tokens per second draft, or none of them."""

from __future__ import annotations

from engine.decoding.drafters.base import Drafter


class AutoDrafter(Drafter):
    """Holds the candidate drafters (lookup, suffix, a model, a head: any Drafter). It never drafts
    itself; begin, prefill and reset reach every member."""

    name = "auto"

    def __init__(self, members: list[Drafter]):
        assert members, "auto drafting needs at least one drafter"
        self.members = list(members)
        self.has_model = any(member.has_model for member in self.members)

    def begin(self, sampling, generator, cancel=None, p_min=0.0) -> None:
        self.sampling = sampling
        for member in self.members:
            member.begin(sampling, generator, cancel, p_min)

    def couple(self, noise) -> None:
        for member in self.members:
            member.couple(noise)

    def prefill(self, context: list[int]) -> None:
        for member in self.members:
            member.prefill(context)

    def reset(self) -> None:
        for member in self.members:
            member.reset()

    def propose(self, context: list[int], k: int):
        raise TypeError("AutoDrafter does not draft itself: the planner asks one of its members")
