"""`auto` priced from whole rounds, checked against plain steps in the same reply, and at T > 0 from
the acceptance sampled rounds get. Synthetic costs and a clock the test advances: no wall clock."""

from __future__ import annotations

import pytest

from engine.decoding.acceptance import AcceptanceModel
from engine.decoding.adaptive import KController
from engine.decoding.pace import CONTROL_AFTER, MIN_DRAFTED, PaceLedger
from engine.decoding.planner import DraftPlanner
from engine.decoding.speculative import RoundResult
from engine.decoding.verify_cost import VerifyCostCurve
from engine.settings import SpeculationSettings
from tests.fake_drafters import EmptyDrafter


def curve_of(points):
    curve = VerifyCostCurve()
    curve.seconds.update(points)
    return curve


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Lookup(EmptyDrafter):
    name = "lookup"


def a_round(drafted: int, accepted: int, draft_s: float, verify_s: float) -> RoundResult:
    return RoundResult(
        tokens=[0] * (accepted + 1),
        drafted=drafted,
        num_accepted=accepted,
        draft_s=draft_s,
        verify_s=verify_s,
        verify_size=drafted + 1,
    )


def measured(alpha: float, rounds: int = 40) -> AcceptanceModel:
    model = AcceptanceModel()
    for i in range(rounds):
        model.observe(1, 1 if i < alpha * rounds else 0)
    return model


def run_reply(planner, clock, outcome, rounds: int, plain_s: float, overhead_s: float, verify_s: dict):
    """`rounds` rounds as the loop runs them: plan, the round (draft + verify), then `overhead_s` more
    (streaming, stats) before the next plan; returns each round's K."""
    ks = []
    for _ in range(rounds):
        plan = planner.plan([1, 2, 3], limit=100)
        if plan.k == 0:
            result = a_round(0, 0, 0.0, plain_s)
        else:
            result = a_round(plan.k, outcome(plan.k), plan.k * 0.001, verify_s[plan.k + 1])
        clock.now += result.draft_s + result.verify_s + overhead_s
        planner.observe(plan, result)
        ks.append(plan.k)
    return ks


def test_a_verify_of_k_plus_one_dearer_than_its_gain_is_not_drafted():
    """Kept 30 % of the time, a draft token is worth 0.3 tokens; a verify of 2 costing 1.4 plain steps
    loses, one costing 1.05 wins."""
    dear = KController(SpeculationSettings(max_k=1), curve_of({1: 0.010, 2: 0.014}), optimism=0.0)
    cheap = KController(SpeculationSettings(max_k=1), curve_of({1: 0.010, 2: 0.0105}), optimism=0.0)
    for controller in (dear, cheap):
        controller.acceptance, controller.draft_step_s = measured(0.3), 0.0001
    assert dear.choose(limit=100) == 0 and dear.plain
    assert cheap.choose(limit=100) == 1 and not cheap.plain


def test_per_round_overhead_is_priced_on_both_sides():
    """A drafted round that spends 3 ms more than a plain step outside its verify (catching up, rolling
    back) loses where the bare forwards said it won."""
    curve = curve_of({1: 0.010, 2: 0.0115})
    controller = KController(SpeculationSettings(max_k=1), curve, optimism=0.0)
    controller.acceptance, controller.draft_step_s = measured(0.3), 0.0001
    assert controller.choose(limit=100) == 1
    controller.plain_overhead_s, controller.round_overhead_s = 0.001, 0.004
    assert controller.choose(limit=100) == 0


def test_the_ledger_measures_each_kind_of_round_whole():
    ledger = PaceLedger()
    ledger.start_reply()
    now = 0.0
    for member, work, extra in [(None, 0.010, 0.001), (0, 0.014, 0.003)] * 5:
        ledger.stamp(now)
        ledger.record(member, 1, 0.0, work)
        now += work + extra
    ledger.stamp(now)
    assert ledger.overhead(drafted=False) == pytest.approx(0.001)
    assert ledger.overhead(drafted=True) == pytest.approx(0.003)
    assert ledger.plain_rate() == pytest.approx(1 / 0.011)
    # a round the clock saw as shorter than its own parts (a simulation) adds no overhead
    ledger.record(None, 1, 0.0, 0.5)
    ledger.stamp(now)
    assert ledger.overhead(drafted=False) == pytest.approx(0.001)


def test_the_planner_prices_from_the_overhead_its_rounds_measured():
    """The bare forwards say a round of one draft token wins (1.3 tokens in 11.6 ms against one in
    10 ms), but each drafted round spends 2.5 ms more than a plain step outside its verify: once the
    loop has timed that, the planner drafts no more."""
    clock = Clock()
    curve = curve_of({1: 0.010, 2: 0.0115})
    controller = KController(SpeculationSettings(max_k=1), curve, optimism=0.0)
    controller.acceptance, controller.draft_step_s = measured(0.3), 0.0001
    planner = DraftPlanner([(Lookup(), controller)], curve, clock=clock)
    planner.start_reply()
    verify = {2: 0.0115}
    kept = iter([1, 0, 0] * 100)
    overhead = {0: 0.0005, 1: 0.003}  # plain steps and drafted rounds: what the loop adds
    ks = []
    for _ in range(60):
        plan = planner.plan([1, 2, 3], limit=100)
        result = (
            a_round(plan.k, next(kept), 0.0001, verify[plan.k + 1]) if plan.k else a_round(0, 0, 0.0, 0.010)
        )
        clock.now += result.draft_s + result.verify_s + overhead[min(plan.k, 1)]
        planner.observe(plan, result)
        ks.append(plan.k)
    assert ks[0] == 1  # priced without overhead, before any round was timed whole
    assert controller.round_overhead_s == pytest.approx(0.003)
    assert ks[-30:].count(0) >= 28, ks


def test_drafted_rounds_that_lose_to_plain_steps_in_the_reply_fall_back_and_reprobe():
    """The price says drafting wins (its acceptance figure is wrong: held at 90 %), but in this reply
    no drafted token is kept, so each drafted round gives one token in 12.2 ms where a plain step
    gives one in 10 ms: the planner benches the drafter, then lets it draft again now and then."""
    clock = Clock()
    curve = curve_of({1: 0.010, 2: 0.011, 3: 0.012})
    controller = KController(SpeculationSettings(max_k=2), curve, optimism=0.0)
    controller.acceptance, controller.draft_step_s = measured(0.9), 0.0001
    planner = DraftPlanner([(Lookup(), controller)], curve, clock=clock)
    planner.start_reply()
    ks = []
    for _ in range(300):
        plan = planner.plan([1, 2, 3], limit=100)
        result = a_round(plan.k, 0, 0.0001 * plan.k, curve.seconds[plan.k + 1])
        clock.now += result.draft_s + result.verify_s
        planner.observe(plan, result)
        controller.acceptance = measured(0.9)  # the mispriced figure
        ks.append(plan.k)
    drafted = [i for i, k in enumerate(ks) if k]
    assert len(drafted) < 90, ks  # benched for most of the reply
    assert any(i > 150 for i in drafted), ks  # and re-probed late in it
    assert planner.plain
    # the same reply without the check drafts every round
    planner = DraftPlanner([(Lookup(), controller)], curve, clock=clock)
    planner.start_reply()
    planner.pace.losing = lambda member, margin=0.0: False
    assert all(planner.plan([1, 2, 3], limit=100).k for _ in range(10))


def test_a_drafter_that_wins_in_the_reply_is_not_benched_and_plain_steps_are_controls_only():
    clock = Clock()
    curve = curve_of({1: 0.010, 2: 0.011, 3: 0.012})
    controller = KController(SpeculationSettings(max_k=2), curve, optimism=0.0)
    controller.acceptance, controller.draft_step_s = measured(0.9), 0.0001
    planner = DraftPlanner([(Lookup(), controller)], curve, clock=clock)
    planner.start_reply()
    ks = run_reply(planner, clock, lambda k: k, 100, 0.010, 0.0005, {2: 0.011, 3: 0.012})
    plain = [i for i, k in enumerate(ks) if k == 0]
    # no plain pace known: a control after MIN_DRAFTED rounds, twice; then one per CONTROL_AFTER
    first = [MIN_DRAFTED, 2 * MIN_DRAFTED + 1]
    assert plain == first + list(range(first[-1] + CONTROL_AFTER + 1, 100, CONTROL_AFTER + 1)), ks


def test_the_ledger_needs_more_than_a_few_unlucky_rounds_to_call_a_loss():
    ledger = PaceLedger()
    ledger.start_reply()
    now = 0.0
    rounds = [(None, 1, 0.010)] * 3 + [(0, 1, 0.013)] * (MIN_DRAFTED - 1)  # a few rounds kept nothing
    for member, tokens, seconds in rounds:
        ledger.stamp(now)
        ledger.record(member, tokens, 0.0, seconds)
        now += seconds
    ledger.stamp(now)
    assert ledger.losing(0) is False  # too few to judge
    for tokens in [1, 1, 1]:  # a verify of 2 costs 1.3 plain steps and keeps nothing, round after round
        ledger.record(0, tokens, 0.0, 0.013)
        now += 0.013
        ledger.stamp(now)
    assert ledger.losing(0) is True
    for tokens in [3] * 16:
        ledger.record(0, tokens, 0.0, 0.013)
        now += 0.013
        ledger.stamp(now)
    assert ledger.losing(0) is False


def test_a_sampled_reply_is_priced_from_sampled_rounds_not_greedy_matches():
    """Greedy, the lookup's token is the target's argmax 90 % of the time; sampling at T > 0 keeps it
    30 % of the time. A sampled reply starts from the sampled rounds' acceptance, and greedy replies
    keep theirs."""
    curve = curve_of({1: 0.010, 2: 0.0135, 3: 0.016})
    controller = KController(SpeculationSettings(max_k=2), curve, optimism=0.0)
    controller.draft_step_s = 0.0001
    planner = DraftPlanner([(Lookup(), controller)], curve, clock=Clock())
    planner.start_reply(sampled=False)
    for i in range(40):
        controller.observe(2, drafted=2, accepted=2 if i % 10 else 0, draft_s=0.0002, verify_s=0.016)
    assert controller.alpha > 0.8 and controller.choose(limit=100) == 2
    planner.start_reply(sampled=True)
    assert controller.sampled and controller.alpha == pytest.approx(0.5)  # nothing sampled yet: the prior
    for i in range(40):  # the sampler's accept events: 30 % of first tokens kept
        kept = 1 if i % 10 < 3 else 0  # the first token kept, the second never
        controller.observe(2, drafted=2, accepted=kept, draft_s=0.0002, verify_s=0.016)
    assert controller.alpha == pytest.approx(0.3, abs=0.08)
    assert controller.choose(limit=100) == 0  # 1.3 tokens in 13.6 ms lose to one in 10 ms
    planner.start_reply(sampled=False)
    assert controller.alpha > 0.8 and controller.choose(limit=100) == 2


def test_a_busy_moment_moves_no_verify_price():
    """One verify of 2 timed while another program held the core (3x) leaves its price where the
    other rounds put it."""
    curve = curve_of({1: 0.010, 2: 0.012})
    for seconds in [0.012, 0.012, 0.036, 0.012, 0.012]:
        curve.observe(2, seconds)
    assert curve.estimate(2) == pytest.approx(0.012)
