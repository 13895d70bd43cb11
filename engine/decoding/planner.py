"""Each round's drafter and K among the drafters a planner owns: the one drafter a user chose, several
(`--draft auto`: the member with the best expected tokens per second, engine.decoding.adaptive prices
each one), or none (plain decoding)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import partial

from engine.decoding.acceptance import AcceptanceModel
from engine.decoding.adaptive import KController, ProbeSchedule
from engine.decoding.drafters.base import (
    Drafter,
    KnowsItsAcceptance,
    Lookahead,
    LooksAhead,
    StopsByConfidence,
    capability,
)
from engine.decoding.pace import PaceLedger
from engine.decoding.verify_cost import VerifyCostCurve
from engine.settings import SpeculationSettings


@dataclass
class Plan:
    """One round's choice: which drafter drafts how many tokens, and the verify size to run."""

    drafter: Drafter | None  # None: a plain step
    controller: KController | None
    k: int
    condition: Hashable = None
    verify_size: int = 1
    # tree_room(d): the nodes, root included, a verify forward may hold when the drafter adds a tree's
    # other branches to the d tokens it drafted (a drafter that stops by its confidence drafts fewer
    # than k); None: chains only
    tree_room: Callable[[int], int] | None = None

    @classmethod
    def plain_step(cls) -> Plan:
        return cls(None, None, 0, None, 1)

    @property
    def drafter_name(self) -> str:
        return self.drafter.name if self.drafter is not None and self.k > 0 else "none"


@dataclass
class _Option:
    index: int
    k: int
    rate: float | None  # expected tokens/s; None before the member was measured
    condition: Hashable
    cap: int


class DraftPlanner:
    """Owns the drafters of one choice, each with its controller, and chooses each round's drafter
    and K: the member with the best expected tokens per second, or none when no member is expected to
    beat a plain step. One member: that drafter's adaptive K. No member: every round a plain step.

    Members never measured are probed first; a member that is not chosen is probed on its own
    controller's schedule (ProbeSchedule.due), so each one can recover.

    Every round is timed whole, from its plan to the next one's (`pace`, a PaceLedger): what a round
    spends outside its draft and verify is added to its price, on both sides of the comparison, and a
    drafter whose rounds in this reply gave fewer tokens per second than plain steps did (beyond
    chance: PaceLedger.losing) is benched: it sits out REPROBE_AFTER rounds, then its rounds are
    judged afresh (twice as long on the bench each time it loses again in the reply).
    """

    REPROBE_AFTER, MAX_BENCH = 8, 256

    def __init__(
        self,
        members: list[tuple[Drafter, KController]],
        curve: VerifyCostCurve,
        name: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.members, self.curve, self.clock = members, curve, clock
        # what the stats call this choice: the one drafter's name, "auto" for several, "none" for none
        default = members[0][0].name if len(members) == 1 else "auto" if members else "none"
        self.name = name or default
        self.plain = False
        self.pace = PaceLedger()
        self._round = 0  # rounds planned in this reply
        self._bench: dict[int, tuple[int, int]] = {}  # member -> (round it may draft again, its bench)

    @property
    def drafters(self) -> list[Drafter]:
        return [drafter for drafter, _ in self.members]

    def plan(self, context: list[int], limit: int) -> Plan:
        self.pace.stamp(self.clock())
        self._round += 1
        overheads = self.pace.overhead(drafted=False), self.pace.overhead(drafted=True)
        for _, controller in self.members:
            controller.plain_overhead_s, controller.round_overhead_s = overheads
        if self.members and self._control_due():
            for _, controller in self.members:  # every member sat this round out
                controller.schedule.sit_out()
            return Plan.plain_step()
        if len(self.members) == 1:
            drafter, controller = self.members[0]
            hint = peek(drafter, context) if limit > 0 else Lookahead(available=0)
            k = controller.choose(limit, hint)
            self.plain = controller.plain
            if k > 0 and self._benched(0):
                self.plain = True
                return Plan.plain_step()
            return self._plan(self.members[0], k, hint.condition, limit)
        return self._plan_among(context, limit)

    def start_reply(self, sampled: bool = False) -> None:
        """A new reply; `sampled`: it samples (T > 0), so its drafts are kept by rejection sampling and
        each drafter is priced from the acceptance measured in sampled replies (KController.set_mode)."""
        self.pace.start_reply()
        self._round, self._bench = 0, {}
        for _, controller in self.members:
            controller.set_mode(sampled)
            controller.start_reply()

    def _control_due(self) -> bool:
        """A plain step among adaptive drafted rounds keeps the comparison's plain side fresh."""
        adaptive = any(controller.speculation.adaptive for _, controller in self.members)
        return adaptive and self.pace.control_due()

    def _benched(self, index: int) -> bool:
        """Whether member `index` sits out this round: on the bench, or its rounds in this reply gave
        fewer tokens per second than plain steps (it goes on the bench now)."""
        controller = self.members[index][1]
        if not controller.speculation.adaptive:
            return False
        bench = self._bench.get(index)
        if bench is not None and self._round < bench[0]:
            return True
        if bench is not None and self.pace.winning(index):  # back from the bench, and winning: forgiven
            del self._bench[index]
        if not self.pace.losing(index, controller.margin):
            return False
        length = self.REPROBE_AFTER if bench is None else min(2 * bench[1], self.MAX_BENCH)
        self._bench[index] = (self._round + length, length)
        self.pace.forget_member(index)
        return True

    def inherit(self, previous: DraftPlanner) -> None:
        """Takes over an earlier planner's controllers for the drafters both share (the same objects):
        what they measured (acceptance, empty rounds, probe interval) stays. Starting over each time
        another member changes (new n-gram sizes, another head) relearnt a losing head within every
        reply, where a reply is too short to learn it."""
        kept = {id(drafter): controller for drafter, controller in previous.members}
        self.members = [(drafter, kept.get(id(drafter), controller)) for drafter, controller in self.members]

    def observe(self, plan: Plan, result) -> None:
        """`result`: a RoundResult (drafted, num_accepted, draft_s, verify_s, catch_up_s, verify_size)."""
        drafted = plan.controller is not None and plan.k > 0
        member = self._index_of(plan.drafter) if drafted else None
        self.pace.record(member, result.num_accepted + 1, result.draft_s, result.verify_s)
        if not drafted:
            self.curve.observe(result.verify_size, result.verify_s)
            return
        # the chain's acceptance is what the models measure: a side node kept is not its next token
        kept = result.num_accepted if result.chain_accepted is None else result.chain_accepted
        confident = capability(plan.drafter, StopsByConfidence)
        if confident is not None and confident.stop_rule is not None:
            plan.controller.calibration.observe(confident.last_confidences, kept)
        plan.controller.observe(
            plan.k,
            result.drafted,
            kept,
            result.draft_s - result.catch_up_s,
            result.verify_s,
            plan.condition,
            result.verify_size,
            tree=result.tree_nodes > 0,
            side_chance=result.side_chance,
            side_won=result.off_chain,
        )

    def _index_of(self, drafter: Drafter | None) -> int | None:
        return next((i for i, (member, _) in enumerate(self.members) if member is drafter), None)

    def note(self) -> str:
        if len(self.members) == 1:
            return self.members[0][1].note()
        return "No drafter is expected to beat the target alone here; decoding plainly." if self.plain else ""

    @property
    def alpha(self) -> float | None:
        return max((controller.alpha for _, controller in self.members), default=None)

    @property
    def draft_step_s(self) -> float | None:
        return self.members[0][1].draft_step_s if self.members else None

    def _plan(self, member, k: int, condition, limit: int) -> Plan:
        drafter, controller = member
        if k <= 0:
            return Plan.plain_step()
        adaptive = controller.speculation.adaptive
        confident = capability(drafter, StopsByConfidence)
        if confident is not None:
            # the drafter stops token by token where its confidence says to; K is only the most it may draft
            most = max(k, min(limit, controller.speculation.max_k))
            rule = controller.stop_rule(most) if adaptive else None
            confident.stop_rule = rule
            k = len(rule.verify_s) - 2 if rule is not None else k
        size = self.curve.padded_size(k + 1, limit=limit + 1) if adaptive else k + 1
        # A tree adds no emitted depth (only the cache must hold it), and is priced as a tree: padding
        # rows are free on the chain's path, not on a tree's (its own graph), so padding gives no room.
        room = partial(controller.tree_size, condition=condition) if controller.speculation.trees else None
        return Plan(drafter, controller, k, condition, size, room)

    def _plan_among(self, context: list[int], limit: int) -> Plan:
        options: list[_Option] = []
        for index, (drafter, controller) in enumerate(self.members):
            if self._benched(index):
                continue
            hint = peek(drafter, context) if limit > 0 else Lookahead(available=0)
            cap = min(limit, controller.speculation.max_k)
            cap = cap if hint.available is None else min(cap, hint.available)
            if cap <= 0:
                continue
            if not controller.speculation.adaptive:
                k = min(controller.speculation.k, cap)
                options.append(
                    _Option(index, k, controller.expected_rate(k, hint.condition), hint.condition, cap)
                )
                continue
            k, rate, _ = controller.best(cap, hint.condition)
            measured = k is not None
            options.append(
                _Option(
                    index,
                    k or min(ProbeSchedule.PROBE_K, cap),
                    rate if measured else None,
                    hint.condition,
                    cap,
                )
            )
        if not options:
            self.plain = any(self._round < until for until, _ in self._bench.values())
            return Plan.plain_step()
        unmeasured = [option for option in options if option.rate is None]
        if unmeasured:
            return self._option_plan(unmeasured[0], limit)
        best = max(options, key=lambda option: option.rate)
        first = self.members[0][1]
        plain_rate = first.expected_rate(0) or 0.0
        self.plain = best.rate <= plain_rate * (1 + first.margin)
        chosen = None if self.plain else best
        if chosen is not None:
            leader = self.members[best.index][1]
            if leader.speculation.adaptive:
                best.k = leader.stretch(best.k, best.cap)
            chosen = self._refresh(options, chosen) or chosen
        for option in options:  # the members sitting this round out count towards their next probe
            controller = self.members[option.index][1]
            if option is chosen or not controller.speculation.adaptive:
                continue
            controller.schedule.sit_out()
            if controller.schedule.due() and chosen is None:
                option.k = controller.schedule.probe_k(option.k, option.cap)
                chosen = option
        return self._option_plan(chosen, limit) if chosen is not None else Plan.plain_step()

    def _refresh(self, options: list[_Option], chosen: _Option) -> _Option | None:
        """A member whose draft step is stale and that would beat the chosen one if drafting cost
        nothing (ProbeSchedule.STALE_AFTER)."""
        for option in options:
            controller = self.members[option.index][1]
            if option is chosen or not controller.speculation.adaptive:
                continue
            k = controller.refresh_k(option.cap, option.condition, chosen.rate)
            if k is not None:
                option.k = k
                return option
        return None

    def _option_plan(self, option: _Option, limit: int) -> Plan:
        return self._plan(self.members[option.index], option.k, option.condition, limit)


def peek(drafter: Drafter, context: list[int]) -> Lookahead:
    """What the drafter's next proposal would be worth; Lookahead() where it cannot tell in advance."""
    ahead = capability(drafter, LooksAhead)
    return ahead.peek(context) if ahead is not None else Lookahead()


def planner_for(
    drafters: list[Drafter],
    speculation: SpeculationSettings,
    curve: VerifyCostCurve,
    previous: DraftPlanner | None = None,
    name: str | None = None,
) -> DraftPlanner:
    """A planner over `drafters` (none: plain decoding), one controller each, competing round by round.
    `previous`: an earlier planner whose controllers carry over for the drafters both share
    (DraftPlanner.inherit)."""
    planner = DraftPlanner(
        [
            (
                drafter,
                KController.for_drafter(drafter, speculation, curve, acceptance=acceptance_for(drafter)),
            )
            for drafter in drafters
        ],
        curve,
        name,
    )
    if previous is not None:
        planner.inherit(previous)
    return planner


def acceptance_for(drafter: Drafter) -> AcceptanceModel:
    """The acceptance model adaptive K starts from: the drafter's own prior where it knows one."""
    known = capability(drafter, KnowsItsAcceptance)
    if known is None or known.acceptance_prior is None:
        return AcceptanceModel()
    first, after_accept = known.acceptance_prior
    return AcceptanceModel(
        prior=first, prior_after_accept=after_accept, prior_weight=known.acceptance_prior_weight
    )
