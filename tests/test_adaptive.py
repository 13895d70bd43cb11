"""Adaptive K: the acceptance model, the verify-cost curve, and the choice of drafter and K.

The throughput tests simulate rounds with a cost model (seconds per verify size, per draft token)
and synthetic drafters whose acceptance is geometric, bimodal or zero; no wall clock is read.
"""

from __future__ import annotations

import random

import pytest

from engine.decoding.acceptance import AcceptanceModel
from engine.decoding.adaptive import KController, ProbeSchedule, expected_tokens
from engine.decoding.drafters import Lookahead
from engine.decoding.planner import DraftPlanner
from engine.decoding.speculative import RoundResult
from engine.decoding.verify_cost import VerifyCostCurve
from engine.settings import SpeculationSettings
from tests.fake_drafters import ConfidentDrafter, EmptyDrafter


def curve_of(points):
    curve = VerifyCostCurve()
    curve.seconds.update(points)
    return curve


def test_expected_tokens():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_curve_interpolates_and_extrapolates():
    curve = curve_of({1: 0.10, 5: 0.24})
    assert curve.estimate(3) == pytest.approx(0.17)
    assert curve.estimate(9) == pytest.approx(0.38)
    assert curve.estimate(5) == 0.24
    single = curve_of({4: 0.2})
    assert single.estimate(1) < single.estimate(4) < single.estimate(8)
    assert VerifyCostCurve().estimate(2) is None


def test_curve_observations_are_averaged():
    curve = VerifyCostCurve(decay=0.5)
    curve.observe(2, 1.0)
    curve.observe(2, 3.0)
    assert curve.estimate(2) == 2.0


def test_one_noisy_measurement_cannot_make_short_drafts_look_expensive():
    """A forward over 2 tokens measured during a load spike must not cost more than one over 4,
    nor more than 2 single steps; otherwise adaptive K would refuse K=1 for no real reason."""
    curve = curve_of({1: 0.10, 2: 0.90, 4: 0.15, 8: 5.0})
    assert curve.estimate(2) == pytest.approx(0.15)
    assert curve.estimate(3) == pytest.approx(0.15)
    assert curve.estimate(8) == pytest.approx(0.80)  # at most 8 single steps
    assert curve.estimate(1) == pytest.approx(0.10)
    assert curve.estimate(4) >= curve.estimate(1)


def test_erratic_curve_pads_to_the_cheaper_larger_size():
    """t(8) < t(6): a verify of 6 runs as 8, and is priced as what it then costs."""
    curve = curve_of({1: 1.0, 5: 2.4, 6: 2.6, 7: 2.7, 8: 2.2, 9: 3.0})
    assert curve.padded_size(6) == 8 and curve.padded_size(7) == 8
    assert curve.estimate(6) == pytest.approx(2.2)
    assert curve.padded_size(6, limit=7) == 6  # never past what the context can hold
    assert curve.padded_size(5) == 8  # 2.2 < 0.95 * 2.4
    assert curve.padded_size(9) == 9 and curve.padded_size(1) == 1


def test_curve_recalibrates_when_the_machine_slows_down():
    curve = curve_of({1: 1.0, 2: 1.3, 4: 1.9})
    for _ in range(20):  # another program takes half the machine: single steps now take 2 s
        curve.observe(1, 2.0)
    assert curve.recalibrations >= 1
    assert curve.estimate(4) > 1.9 * 1.5  # the sizes not observed were rescaled too
    steady = curve_of({1: 1.0, 2: 1.3})
    for _ in range(20):
        steady.observe(1, 1.05)
    assert steady.recalibrations == 0


def test_one_size_measured_off_corrects_that_size_and_not_the_single_step():
    """A stored t(4) of 1.0 that really costs 1.5 (seen in the loop: a curve whose larger sizes were
    measured too cheap) must not make plain decoding look slower: t(1) stays, t(4) moves to 1.5."""
    curve = curve_of({1: 1.0, 2: 1.05, 4: 1.0, 8: 1.7})
    for _ in range(30):
        curve.observe(4, 1.5)
        curve.observe(1, 1.0)
    assert curve.recalibrations == 0
    assert curve.estimate(1) == pytest.approx(1.0)
    assert curve.estimate(4) == pytest.approx(1.5, rel=0.02)


# --- the acceptance model ----------------------------------------------------------------------


def test_acceptance_model_fits_a_bimodal_drafter():
    """Right for many tokens or wrong at the first: p_0 is low, later positions high; the
    geometric model from the overall rate would badly underestimate long drafts."""
    model = AcceptanceModel()
    rng = random.Random(0)
    for _ in range(400):
        model.observe(8, 8 if rng.random() < 0.3 else 0)
    p = model.conditional()
    assert p[0] == pytest.approx(0.3, abs=0.08)
    assert min(p[1:8]) > 0.8
    overall = 0.3 * 8 / (0.3 * 8 + 0.7)  # accepted / decided over all positions
    assert model.expected_tokens(8) == pytest.approx(1 + 0.3 * 8, rel=0.15)
    assert expected_tokens(overall, 8) > 1.2 * model.expected_tokens(8)


def test_a_reply_that_contradicts_the_earlier_ones_drops_their_counts():
    from engine.decoding.acceptance import AcceptanceModel

    model = AcceptanceModel()
    for _ in range(200):  # earlier replies: the first draft token kept half the time
        model.observe(2, 1)
        model.observe(2, 0)
    model.start_reply(0.3)
    for _ in range(3):  # three misses: possible at 0.5, the earlier counts still weigh
        model.observe(2, 0)
    assert model.conditional()[0] > 0.3
    for _ in range(3):  # six in a row: 1.6 % likely at 0.5, this prompt is another matter
        model.observe(2, 0)
    assert model.conditional()[0] < 0.1
    # and its own rounds are judged without the benefit of the doubt a rarely measured drafter gets
    assert model.conditional(optimism=1.0)[0] == model.conditional()[0]

    model.start_reply(0.3)  # the reverse: a drafter measured poor meets a prompt it is right on
    for _ in range(6):
        model.observe(2, 2)
    assert model.conditional()[0] > 0.8


def test_a_reply_starts_from_what_was_measured_held_more_loosely():
    """A new reply keeps the earlier figure, on fewer counts: it is not pulled back to the uninformed
    prior (a drafter right one time in five looked right one time in four again at every reply's
    start), and the reply's own rounds move it quickly."""
    model = AcceptanceModel()
    for i in range(100):
        model.observe(1, int(i % 5 == 0))
    before = model.conditional()[0]
    model.start_reply(0.3)
    assert abs(model.conditional()[0] - before) < 0.01
    for _ in range(3):
        model.observe(1, 1)
    assert model.conditional()[0] > before + 0.15


def test_a_lookups_new_match_length_gets_the_doubt_of_the_drafters_rounds_not_a_near_certainty():
    """The upper bound counts all of a drafter's rounds: a match length never seen before leans on
    the drafter's own figure, and must not outbid a drafter measured right nine times in ten."""
    model = AcceptanceModel()
    for _ in range(30):
        model.observe(4, 0, condition=2)  # 2-token matches: rejected at the first token
    point, bound = model.conditional(8)[0], model.conditional(8, optimism=1.0)[0]
    assert point < 0.1
    assert bound - point < 0.1  # with a bound from the condition's own (zero) rounds: 0.2 more
    assert bound < model.conditional(2, optimism=1.0)[0] + 0.1


def test_acceptance_is_kept_per_condition_and_shrunk_to_the_drafter_while_rare():
    model = AcceptanceModel()
    for _ in range(100):
        model.observe(4, 4, condition=8)
        model.observe(4, 0, condition=2)
    assert model.conditional(8)[0] > 0.9 and model.conditional(2)[0] < 0.1
    assert model.conditional(5)[0] == pytest.approx(model.conditional()[0])  # never seen: the pooled figure


# --- choosing K ----------------------------------------------------------------------------------


def geometric(alpha, weight=1000.0):
    model = AcceptanceModel()
    model._all.accepted = [alpha * weight] * model.positions
    model._all.decided = [weight] * model.positions
    return model


def controller(alpha, draft_step_s, curve, **settings):
    k = KController(SpeculationSettings(**settings), curve, acceptance=geometric(alpha))
    k.draft_step_s, k.optimism = draft_step_s, 0.0
    return k


def test_high_acceptance_cheap_draft_flat_verify_picks_long_drafts():
    flat = curve_of({1: 0.1, 16: 0.11})
    assert controller(0.95, 0.005, flat, max_k=16).choose(limit=100) >= 8


def test_steep_verify_cost_picks_shorter_drafts():
    flat = curve_of({1: 0.1, 16: 0.11})
    steep = curve_of({1: 0.1, 2: 0.143, 3: 0.175, 5: 0.24, 9: 0.28, 16: 0.31})
    k_flat = controller(0.8, 0.01, flat, max_k=16).choose(limit=100)
    k_steep = controller(0.8, 0.01, steep, max_k=16).choose(limit=100)
    assert 1 <= k_steep < k_flat


def test_slow_speculation_falls_back_to_plain_and_reprobes():
    steep = curve_of({1: 0.1, 2: 0.143, 5: 0.24})
    k = controller(0.3, 0.07, steep)
    choices = [k.choose(limit=100) for _ in range(64)]
    assert k.plain and "slower" in k.note()
    assert choices.count(0) == 62 and max(choices) >= 1  # two probes in 64 rounds


def test_a_probe_the_confidence_stop_left_empty_counts_as_lost():
    """A drafter that stops by its own confidence may draft nothing on a probe; it still paid a draft
    step, so the probes thin out as after any lost probe."""
    k = controller(0.3, 0.07, curve_of({1: 0.1, 2: 0.143, 5: 0.24}))
    probes = []
    for _ in range(500):
        chosen = k.choose(limit=100)
        if chosen:
            probes.append(k.schedule.interval)
            k.observe(chosen, drafted=0, accepted=0, draft_s=0.007, verify_s=0.1)
    assert len(probes) >= 3 and probes == sorted(probes) and probes[-1] >= 4 * probes[0]


def test_probes_that_win_and_lose_by_turns_do_not_crowd_the_plain_rounds():
    """A head on a target whose verify rows are dear: its probes alternate between stopping before
    the first token and keeping one token. Winning probes used to quarter the interval and losing ones
    only double it, so probing took over every other round; now the interval holds."""
    k = controller(0.3, 0.007, curve_of({1: 0.1, 2: 0.15, 5: 0.34}))
    probes = 0
    for _ in range(400):
        chosen = k.choose(limit=100)
        if chosen:
            kept = probes % 2
            probes += 1
            k.observe(chosen, drafted=kept, accepted=kept, draft_s=0.007, verify_s=0.15 if kept else 0.1)
            k.acceptance = geometric(0.3)
    assert probes <= 40, probes


def test_recovers_when_acceptance_rises():
    k = controller(0.3, 0.01, curve_of({1: 0.1, 2: 0.143, 5: 0.24}))
    k.acceptance = AcceptanceModel(prior=0.1)
    k.choose(limit=100)
    assert k.plain
    for _ in range(20):
        k.observe(4, drafted=4, accepted=4, draft_s=0.04, verify_s=0.2)
    assert k.choose(limit=100) > 0 and not k.plain


def test_fixed_k_and_limit():
    k = controller(0.1, 1.0, curve_of({1: 0.1}), k=6)
    assert k.choose(limit=100) == 6
    assert k.choose(limit=2) == 2
    assert controller(0.9, 0.001, curve_of({1: 0.1, 8: 0.1})).choose(limit=0) == 0


def test_first_round_probes_before_anything_is_measured():
    assert (
        KController(SpeculationSettings(max_k=8), VerifyCostCurve()).choose(limit=100)
        == ProbeSchedule.PROBE_K
        == 2
    )


def test_a_lookup_without_a_match_is_not_drafted():
    k = controller(0.9, 0.001, curve_of({1: 0.1, 8: 0.1}))
    assert k.choose(limit=100, hint=Lookahead(condition=0, available=0)) == 0
    assert k.choose(limit=100, hint=Lookahead(condition=4, available=3)) <= 3


# --- simulated throughput --------------------------------------------------------------------------

# seconds per verify forward of n tokens on an erratic machine (t(8) < t(6)), as calibrated
TRUE_VERIFY = {1: 1.0, 2: 1.3, 3: 1.5, 4: 1.9, 5: 2.4, 6: 2.6, 7: 2.7, 8: 2.2, 9: 3.0, 13: 3.6, 17: 4.4}


def true_verify(n):
    if n in TRUE_VERIFY:
        return TRUE_VERIFY[n]
    return curve_of(TRUE_VERIFY)._interpolate(n)


class SyntheticDrafter(EmptyDrafter):
    """A drafter reduced to its statistics: `outcome(rng, k, condition)` is how many of k drafts the
    target accepts. A lookup-like one tells its match condition in advance, as NgramDrafter does."""

    def __init__(self, name, outcome, draft_step_s, conditions=(None,), weights=(1.0,)):
        self.name, self.outcome, self.draft_step_s = name, outcome, draft_step_s
        self.conditions, self.weights = conditions, weights
        self.next_condition = None

    def peek(self, context):
        return Lookahead(condition=self.next_condition)


def geometric_outcome(alpha):
    def outcome(rng, k, condition):
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        return accepted

    return outcome


def bimodal_outcome(right_by_condition):
    def outcome(rng, k, condition):
        if rng.random() >= right_by_condition[condition]:
            return 0
        return geometric_outcome(0.95)(rng, k, condition)

    return outcome


def simulated_round(
    drafted: int, accepted: int, draft_s: float, verify_s: float, verify_size: int
) -> RoundResult:
    """A chain round as the loop reports it; its tokens stay empty, as the planner never reads them."""
    return RoundResult(
        tokens=[],
        drafted=drafted,
        num_accepted=accepted,
        draft_s=draft_s,
        verify_s=verify_s,
        verify_size=verify_size,
    )


def text_conditions(rng, drafter, length, mean_run=24):
    conditions = []
    while len(conditions) < length:
        run = 1 + int(rng.expovariate(1 / mean_run))
        conditions += [rng.choices(drafter.conditions, drafter.weights)[0]] * run
    return conditions


def simulate(drafters, k=None, tokens=6000, seed=0):
    """Tokens per simulated second with fixed K (k) or adaptive K (None); K = 0 is plain decoding.

    The match condition belongs to the text, not to the round: the text runs in stretches (a
    passage that repeats earlier text, then new text), and a round sees the condition where it
    starts, so a round that emits more tokens gets through its stretch sooner."""
    rng = random.Random(seed)
    curve = curve_of(TRUE_VERIFY)  # a calibration that measured these sizes
    speculation = SpeculationSettings(k=k) if k else SpeculationSettings()
    planner = DraftPlanner([(d, KController(speculation, curve)) for d in drafters], curve)
    texts = {id(d): text_conditions(rng, d, tokens + 20) for d in drafters}
    emitted = seconds = 0.0
    while emitted < tokens:
        for drafter in drafters:
            drafter.next_condition = texts[id(drafter)][int(emitted)]
        if k == 0:
            emitted, seconds = emitted + 1, seconds + true_verify(1)
            continue
        plan = planner.plan([], limit=16)
        accepted = plan.drafter.outcome(rng, plan.k, plan.drafter.next_condition) if plan.k else 0
        draft_s = plan.k * plan.drafter.draft_step_s if plan.k else 0.0
        size = max(plan.verify_size, plan.k + 1)
        verify_s = true_verify(size)
        planner.observe(plan, simulated_round(plan.k, accepted, draft_s, verify_s, size))
        emitted, seconds = emitted + accepted + 1, seconds + draft_s + verify_s
    return emitted / seconds


DRAFTERS = {
    "geometric": lambda: [SyntheticDrafter("model", geometric_outcome(0.75), 0.08)],
    "bimodal": lambda: [SyntheticDrafter("lookup", bimodal_outcome({None: 0.35}), 0.005)],
    "bimodal by match length": lambda: [
        SyntheticDrafter(
            "lookup", bimodal_outcome({2: 0.05, 4: 0.3, 8: 0.9}), 0.005, (2, 4, 8), (0.5, 0.3, 0.2)
        )
    ],
    "zero": lambda: [SyntheticDrafter("lookup", lambda rng, k, c: 0, 0.005)],
    "zero, costly": lambda: [SyntheticDrafter("model", lambda rng, k, c: 0, 0.2)],
}


@pytest.mark.parametrize("shape", list(DRAFTERS))
def test_adaptive_k_comes_close_to_the_best_fixed_k_and_never_loses(shape):
    plain = simulate(DRAFTERS[shape](), k=0)
    fixed = {k: simulate(DRAFTERS[shape](), k=k) for k in range(1, 9)}
    best_fixed = max([plain, *fixed.values()])
    adaptive = simulate(DRAFTERS[shape]())
    assert adaptive >= 0.95 * best_fixed, (adaptive, best_fixed, fixed)
    assert adaptive >= 0.99 * plain, (adaptive, plain)


def test_the_match_length_lets_adaptive_k_beat_every_fixed_k():
    """With acceptance that depends on the match length, drafting only long matches wins."""
    drafters = DRAFTERS["bimodal by match length"]
    best_fixed = max(simulate(drafters(), k=k) for k in range(0, 9))
    assert simulate(drafters()) > 1.05 * best_fixed


def test_auto_picks_the_better_drafter_each_round():
    """A model draft with steady acceptance and a lookup that is sometimes perfect: auto drafts
    with whichever pays in each round and beats both alone."""

    def both():
        return [
            SyntheticDrafter("lookup", bimodal_outcome({2: 0.02, 8: 0.95}), 0.005, (2, 8), (0.7, 0.3)),
            SyntheticDrafter("model", geometric_outcome(0.6), 0.1),
        ]

    auto = simulate(both())
    lookup_alone = simulate(both()[:1])
    model_alone = simulate(both()[1:])
    assert auto >= 1.02 * max(lookup_alone, model_alone), (auto, lookup_alone, model_alone)
    assert auto >= simulate(both(), k=0)


def test_auto_with_only_losing_drafters_stays_plain():
    drafters = [
        SyntheticDrafter("a", lambda rng, k, c: 0, 0.01),
        SyntheticDrafter("b", lambda rng, k, c: 0, 0.3),
    ]
    assert simulate(drafters) >= 0.99 * simulate(drafters, k=0)


def test_a_break_even_costly_drafter_does_not_lose_through_its_probes():
    """A quantized copy at acceptance 0.5 and c = 0.2 only breaks even at K = 1; probes that draft
    far past that (or follow each other whenever one keeps a token) would lose about 14 %."""
    drafter = lambda: [SyntheticDrafter("model", geometric_outcome(0.5), 0.2)]  # noqa: E731
    assert simulate(drafter()) >= 0.97 * simulate(drafter(), k=0)


def test_a_draft_as_slow_as_the_target_is_hardly_probed_even_over_many_short_replies():
    """Every draft token accepted, but each draft step costs a target step: no K can beat a plain
    step, so once measured it is probed once in MAX_PROBE_INTERVAL rounds, not again at every
    reply's start (on a GPU such probes cost 10-17 % of a short reply)."""
    drafter = SyntheticDrafter("model", lambda rng, k, c: k, 1.05 * true_verify(1))
    curve = curve_of(TRUE_VERIFY)
    planner = DraftPlanner([(drafter, KController(SpeculationSettings(), curve))], curve)
    drafted_rounds = []
    for _reply in range(40):
        planner.start_reply()
        for _ in range(64):
            plan = planner.plan([], limit=16)
            draft_s = plan.k * drafter.draft_step_s
            size = max(plan.verify_size, plan.k + 1)
            planner.observe(plan, simulated_round(plan.k, plan.k, draft_s, true_verify(size), size))
            drafted_rounds.append(plan.k > 0)
    assert sum(drafted_rounds[128:]) <= 2, sum(drafted_rounds)


def test_one_slow_first_draft_step_does_not_condemn_a_good_drafter():
    """A draft's first steps on a GPU may include capturing its graphs: thirty times its real cost."""
    rng = random.Random(0)
    drafter = SyntheticDrafter("model", geometric_outcome(0.8), 0.05)
    curve = curve_of(TRUE_VERIFY)
    planner = DraftPlanner([(drafter, KController(SpeculationSettings(), curve))], curve)
    drafted_rounds = []
    for round_index in range(400):
        plan = planner.plan([], limit=16)
        accepted = drafter.outcome(rng, plan.k, None) if plan.k else 0
        draft_s = plan.k * drafter.draft_step_s * (30 if round_index == 0 else 1)
        size = max(plan.verify_size, plan.k + 1)
        planner.observe(plan, simulated_round(plan.k, accepted, draft_s, true_verify(size), size))
        drafted_rounds.append(plan.k > 0)
    assert sum(drafted_rounds[200:]) > 150


def test_acceptance_follows_a_prompt_where_the_draft_is_suddenly_poor():
    """A head measured at 0.5 over 2,000 tokens meets a prompt where it is right 12 % of the time
    (another language, say): adaptive K must stop drafting early in the reply. With a memory of about
    100 rounds (decay 0.99) that 64-token reply ran at 0.83x plain; with 33 rounds, 0.89x; now that a
    reply's first rounds can overrule the earlier replies' counts (AcceptanceModel.start_reply),
    0.95x."""
    from engine.decoding.acceptance import AcceptanceModel

    def poor_reply_rate(seed):
        rng = random.Random(seed)
        curve = curve_of(TRUE_VERIFY)
        drafter = SyntheticDrafter("head", geometric_outcome(0.5), 0.06)
        planner = DraftPlanner(
            [(drafter, KController(SpeculationSettings(), curve, acceptance=AcceptanceModel()))], curve
        )
        for alpha, tokens in ((0.5, 2000), (0.12, 64)):
            planner.start_reply()
            drafter.outcome = geometric_outcome(alpha)
            emitted = seconds = 0.0
            while emitted < tokens:
                plan = planner.plan([], limit=16)
                accepted = drafter.outcome(rng, plan.k, None) if plan.k else 0
                draft_s = plan.k * drafter.draft_step_s
                size = max(plan.verify_size, plan.k + 1)
                planner.observe(plan, simulated_round(plan.k, accepted, draft_s, true_verify(size), size))
                emitted, seconds = emitted + accepted + 1, seconds + draft_s + true_verify(size)
        return emitted / seconds  # plain decoding: 1 token per true_verify(1) = 1 s

    assert sum(poor_reply_rate(seed) for seed in range(8)) / 8 >= 0.93


def test_a_drafter_whose_later_tokens_are_no_likelier_starts_with_shorter_drafts():
    """A lookup match that was right once is usually right again (prior 0.8 after an accepted token);
    a draft head's second token is about as likely as its first. A drafter says so through its
    acceptance_prior, and adaptive K starts from it."""
    from engine.decoding.planner import acceptance_for

    class HeadLike(EmptyDrafter):
        acceptance_prior, acceptance_prior_weight = (0.5, 0.44), 1.0

    curve = curve_of({1: 0.015, 2: 0.017, 3: 0.019, 5: 0.022, 9: 0.032})
    lookup_like = KController(SpeculationSettings(), curve, acceptance=acceptance_for(EmptyDrafter()))
    head_like = KController(SpeculationSettings(), curve, acceptance=acceptance_for(HeadLike()))
    for k in (lookup_like, head_like):
        k.optimism = 0.0
        k.observe(2, drafted=2, accepted=1, draft_s=0.002, verify_s=0.019, verify_size=3)
    assert 1 <= head_like.choose(limit=100) < lookup_like.choose(limit=100)


def test_a_drafter_that_stops_by_its_confidence_is_judged_by_its_measured_acceptance():
    """A draft head at a fifth of a target step, measured just below break-even: at a reply's start
    the earlier replies' counts weigh little, and the optimistic bound on its acceptance would have it
    draft at a loss. Its stop rule already picks each round's tokens by confidence, so it is judged by
    what it measured; a lookup with the same figures still gets the benefit of the doubt."""

    class HeadLike(ConfidentDrafter):
        pass

    curve = curve_of({1: 0.1, 2: 0.124, 3: 0.15, 5: 0.2})
    controllers = {}
    for name, drafter in (("head", HeadLike()), ("lookup", EmptyDrafter())):
        k = KController.for_drafter(drafter, SpeculationSettings(), curve)
        for round_index in range(40):  # acceptance 0.4 at K = 1 (break-even 0.44), draft steps 0.02 s
            k.observe(1, drafted=1, accepted=round_index % 20 < 8, draft_s=0.02, verify_s=0.124)
        k.start_reply()
        controllers[name] = k
    assert controllers["head"].choose(limit=64) == 0 and controllers["head"].plain
    assert controllers["lookup"].choose(limit=64) > 0  # the bound at work: what the head no longer gets


def test_a_tree_gets_room_only_where_every_size_up_to_it_is_cheap_as_a_tree():
    """A curve stored under load priced sizes 1-5 alike; t(2) and t(3) were then observed dearer, t(4)
    and t(5) never were. Trees granted room up to 5 held three nodes, and verified at the price of a
    size-3 tree: the room stops where a size is dear, and tree verifies are priced as trees."""
    curve = curve_of({1: 0.020, 2: 0.020, 3: 0.020, 4: 0.020, 5: 0.020})
    assert curve.widest_at_cost(2, limit=32) == 5
    curve.seconds.update({2: 0.022, 3: 0.027})  # chains of 2 and 3, as measured since
    assert curve.widest_at_cost(2, limit=32) == 2
    curve = curve_of({1: 0.020, 2: 0.020, 3: 0.020, 4: 0.020})
    k = KController(SpeculationSettings(), curve)
    k.observe(1, drafted=1, accepted=0, draft_s=0.002, verify_s=0.030, verify_size=3, tree=True)
    assert curve.seconds[3] == 0.020  # the chain's figure is not the tree's
    assert curve.widest_at_cost(2, limit=32) == 2  # a three-node tree costs 1.5 chains of two


def test_a_tree_size_never_timed_is_priced_like_the_trees_that_were():
    """A flat chain curve (a verify of two to five tokens costs one step) and a three-node tree timed
    at 1.5 of its chain: a chain of three would otherwise buy four- and five-node trees at the chain's
    figure, and each such size would cost a losing round before its own timing said so."""
    curve = curve_of({1: 0.020, 2: 0.020, 3: 0.020, 4: 0.0203, 5: 0.0205})
    assert curve.widest_at_cost(3, limit=32) == 5  # nothing timed as a tree yet: the chain's figures
    curve.observe_tree(3, 0.030)
    assert curve.tree_price(4) == pytest.approx(0.0203 * 1.5)
    assert curve.widest_at_cost(3, limit=32) == 3
    curve.observe_tree(4, 0.0204)  # a tree of four timed cheap after all: its own figure counts
    assert curve.widest_at_cost(3, limit=32) == 4


def test_padding_a_verify_gives_a_tree_no_room():
    """t(2) dear and t(5) cheap: a round drafting one token verifies five rows, padded. The padding
    rows are free on the chain's path only; a tree runs its own (on a compiled CPU runner, the
    uncompiled forward at 1.5 chains), so padding turned every such round into a dear tree round,
    trees on or off. Trees of three or four nodes cost what a chain of three or four does here."""
    curve = curve_of({1: 0.020, 2: 0.023, 3: 0.023, 4: 0.023, 5: 0.021})
    for trees in (False, True):
        planner = DraftPlanner(
            [(EmptyDrafter(), KController(SpeculationSettings(trees=trees), curve))], curve
        )
        plan = planner._plan(planner.members[0], 1, None, limit=16)
        assert plan.verify_size == 5 and (plan.tree_room is None or plan.tree_room(1) == 2), trees
    curve = curve_of({1: 0.020, 2: 0.020, 3: 0.020, 4: 0.020, 5: 0.020})
    planner = DraftPlanner([(EmptyDrafter(), KController(SpeculationSettings(), curve))], curve)
    assert planner._plan(planner.members[0], 1, None, limit=16).tree_room(1) == 3  # where trees are free


def test_side_nodes_are_granted_by_what_they_are_expected_to_save():
    """One side node beside each draft token, shallowest first, while the tokens it is expected to
    save (the chain failing at its depth, times how often a side node was right there) pay for the
    dearer verify; a drafter whose side nodes are never right gets none, however cheap they are."""
    flat = curve_of({1: 0.020, 2: 0.020, 3: 0.020, 4: 0.020, 5: 0.020, 7: 0.020})
    k = KController(SpeculationSettings(), flat)
    for _ in range(2):  # the first draft token fails: a side node beside it pays
        k.observe(3, drafted=3, accepted=0, draft_s=0.0003, verify_s=0.020, verify_size=4)
    assert k.tree_size(3) == 5
    assert k.tree_size(3, limit=4) == 4  # no room
    k = KController(SpeculationSettings(), flat)
    for _ in range(4):  # the second one fails: side nodes down to it
        k.observe(3, drafted=3, accepted=1, draft_s=0.0003, verify_s=0.020, verify_size=4)
    assert k.tree_size(3) == 6
    steep = curve_of({1: 0.020, 2: 0.022, 3: 0.026, 4: 0.030, 5: 0.034, 7: 0.042})
    k = KController(SpeculationSettings(), steep)
    for _ in range(2):
        k.observe(3, drafted=3, accepted=0, draft_s=0.0003, verify_s=0.030, verify_size=4)
    assert k.tree_size(3) == 4  # each node costs a fifth of a step: a chain
    k = KController(SpeculationSettings(), flat)
    for round in range(60):  # trees whose side node never once saved a round the chain lost
        k.observe(
            1,
            drafted=1,
            accepted=round % 2,
            draft_s=0.0003,
            verify_s=0.020,
            verify_size=3,
            tree=True,
            side_chance=round % 2 == 0,
            side_won=False,
        )
    assert k.side_acceptance < 0.05 and k.tree_size(1) == 2
    for round in range(60):
        k.observe(
            1,
            drafted=1,
            accepted=round % 2,
            draft_s=0.0003,
            verify_s=0.020,
            verify_size=3,
            tree=True,
            side_chance=round % 2 == 0,
            side_won=round % 2 == 0,
        )
    assert k.side_acceptance > 0.5 and k.tree_size(1) == 3


def test_a_tree_timed_dear_once_is_tried_again_after_chain_rounds():
    """A tree size timed at 1.3 chains (the machine was busy) keeps trees out; nothing would re-time a
    size never granted, so each chain round fades its excess over the chain, and trees come back."""
    curve = curve_of({1: 0.020, 2: 0.020, 3: 0.020})
    k = KController(SpeculationSettings(), curve)
    k.observe(1, drafted=1, accepted=0, draft_s=0.0003, verify_s=0.026, verify_size=3, tree=True)
    assert k.tree_size(1) == 2
    for round in range(150):
        k.observe(1, drafted=1, accepted=round % 2, draft_s=0.0003, verify_s=0.020, verify_size=2)
    assert curve.tree_price(3) < 0.0204 and k.tree_size(1) == 3


def test_a_new_planner_keeps_what_its_unchanged_drafters_measured():
    """A new member (the n-gram drafter at other sizes) makes a new auto planner; the head in it is
    the same object, and its controller (acceptance, empty rounds, probe pace) goes on where it was."""
    from engine.decoding.planner import planner_for

    head = SyntheticDrafter("head", geometric_outcome(0.3), 0.03)
    first = planner_for([head], SpeculationSettings(), curve_of(TRUE_VERIFY))
    lookup = SyntheticDrafter("lookup", geometric_outcome(0.3), 0.001)
    second = DraftPlanner([(lookup, KController(SpeculationSettings(), first.curve))], first.curve)
    second.members.append((head, KController(SpeculationSettings(), first.curve)))
    second.inherit(first)
    assert second.members[1][1] is first.members[0][1]
    assert second.members[0][1] is not first.members[0][1]


TRAP_CURVE = {1: 0.020, 2: 0.021, 3: 0.0215, 4: 0.022, 5: 0.0225, 8: 0.024, 9: 0.030}


def ks_after_losing_the_second_token_once(acceptance=None, rounds: int = 8) -> list[int]:
    """The K adaptive K chooses, round by round, for a drafter whose first round loses its second
    token and whose every later round keeps all it drafts (9 ms a draft token)."""
    curve = curve_of(TRAP_CURVE)
    k = KController(SpeculationSettings(), curve, acceptance=acceptance)
    k.start_reply()
    ks = []
    for round_ in range(rounds):
        chosen = k.choose(limit=100)
        ks.append(chosen)
        accepted = 1 if round_ == 0 else chosen
        k.observe(
            chosen,
            drafted=chosen,
            accepted=accepted,
            draft_s=0.009 * chosen,
            verify_s=curve.estimate(chosen + 1),
        )
    return ks


def test_a_copy_whose_probe_lost_its_second_token_is_not_held_at_one_token(monkeypatch):
    """A quantized copy starts from its check's agreement (0.98), worth a few rounds. Its first round
    drafts two tokens and loses the second; every round after keeps all it drafts. At the weight of a
    guess, that one rejection halved the second position's estimate and K stayed at 1 for the rest of
    the reply, as rounds of one token never decide the second position again."""
    from engine.decoding.drafters.model import CHECKED_PRIOR_WEIGHT
    from engine.decoding.planner import acceptance_for

    class CheckedCopy(EmptyDrafter):
        acceptance_prior = (0.98, 0.98)
        acceptance_prior_weight = CHECKED_PRIOR_WEIGHT

    class GuessedCopy(CheckedCopy):
        acceptance_prior_weight = 1.0

    checked = ks_after_losing_the_second_token_once(acceptance_for(CheckedCopy()))
    assert checked[0] == ProbeSchedule.PROBE_K and min(checked[2:]) >= 4, checked
    monkeypatch.setattr(KController, "STRETCH_AFTER", 10**9)  # without the stretch (the next test)
    assert max(ks_after_losing_the_second_token_once(acceptance_for(GuessedCopy()))[1:]) == 1


def test_a_drafter_without_a_measured_prior_is_not_held_below_a_position_it_lost_once(monkeypatch):
    """A drafter with no figure before its first round (a lookup, a model that is not a copy) loses
    the second token of its first round and keeps everything after. Rounds that keep all K tokens
    never decide position K, so without a stretch K stays at 1 until the decay forgets that round."""
    stretched = ks_after_losing_the_second_token_once(rounds=12)
    assert stretched[0] == ProbeSchedule.PROBE_K and max(stretched[-4:]) >= 3, stretched
    monkeypatch.setattr(KController, "STRETCH_AFTER", 10**9)
    assert max(ks_after_losing_the_second_token_once(rounds=12)[1:]) == 1  # the trap, without the stretch


def test_a_drafter_that_stops_by_its_confidence_is_priced_at_what_its_rounds_gave():
    """A draft head keeps every token it drafts, but its confidence stops it after one token a round
    (2 tokens in 23 ms: 87 tok/s). Priced for K tokens from its per-position acceptance it looked
    worth about 108 tok/s, and `auto` gave it the rounds of a copy whose rounds give 8 tokens in
    87 ms (92 tok/s). Its price is now capped by its rounds' real yield."""
    curve = curve_of(TRAP_CURVE)

    class Head(ConfidentDrafter):
        name = "head"

    class Copy(EmptyDrafter):
        name = "copy"

    def planner(caps_by_yield: bool) -> DraftPlanner:
        head = KController.for_drafter(Head(), SpeculationSettings(), curve)
        head.caps_by_yield = caps_by_yield
        copy = KController.for_drafter(Copy(), SpeculationSettings(), curve)
        for _ in range(6):
            head.observe(8, drafted=1, accepted=1, draft_s=0.002, verify_s=curve.estimate(2))
            copy.observe(7, drafted=7, accepted=7, draft_s=0.063, verify_s=curve.estimate(8))
        return DraftPlanner([(Head(), head), (Copy(), copy)], curve)

    capped = planner(caps_by_yield=True)
    head_controller = capped.members[0][1]
    assert head_controller.measured_rate() == pytest.approx(2 / (0.002 + curve.estimate(2)))
    assert head_controller.best(8)[1] == pytest.approx(head_controller.measured_rate())
    assert capped.plan([1, 2, 3], limit=100).drafter_name == "copy"
    assert planner(caps_by_yield=False).plan([1, 2, 3], limit=100).drafter_name == "head"


def rounds_of_a_copy_timed_while_the_machine_was_busy(rounds: int = 200) -> list[str]:
    """`auto` between a head (kept half the time, a cheap step) and a copy (kept 95 %) whose first
    rounds, the only ones it drafted, ran while something else held the CPU: a draft step as dear as
    a target step. The machine is quiet from round 10 on, where the copy's step is a quarter of one."""
    rng = random.Random(0)
    curve = curve_of(TRUE_VERIFY)
    head = SyntheticDrafter("head", geometric_outcome(0.5), 0.05)
    copy = SyntheticDrafter("copy", geometric_outcome(0.95), 0.25)
    planner = DraftPlanner([(d, KController(SpeculationSettings(), curve)) for d in (head, copy)], curve)
    chosen = []
    for round_index in range(rounds):
        plan = planner.plan([], limit=100)
        if plan.k == 0:
            planner.observe(plan, simulated_round(0, 0, 0.0, TRUE_VERIFY[1], 1))
            chosen.append("none")
            continue
        busy = 4.0 if round_index < 10 and plan.drafter is copy else 1.0
        accepted = plan.drafter.outcome(rng, plan.k, None)
        size = max(plan.verify_size, plan.k + 1)
        draft_s = plan.k * plan.drafter.draft_step_s * busy
        planner.observe(plan, simulated_round(plan.k, accepted, draft_s, true_verify(size), size))
        chosen.append(plan.drafter.name)
    return chosen


def test_a_drafter_priced_from_a_busy_moment_is_measured_again(monkeypatch):
    """Priced at its busy step (0.73 tokens per target step against the head's 1.1) the copy lost
    every round to the head and, never drafting, was never timed again. Now it gets a round once it
    has sat out ProbeSchedule.STALE_AFTER of them, since only its step holds it back, and is timed at
    its quiet 0.25 (1.7 tokens per step): it drafts from then on."""
    chosen = rounds_of_a_copy_timed_while_the_machine_was_busy()
    assert "copy" in chosen[2 : 2 + ProbeSchedule.STALE_AFTER + 2]
    assert chosen[100:].count("copy") >= 90, chosen
    monkeypatch.setattr(ProbeSchedule, "STALE_AFTER", 10**9)
    assert rounds_of_a_copy_timed_while_the_machine_was_busy()[2:].count("copy") == 0
