"""GenerationStats: the one source of the speed figures every view shows."""

from __future__ import annotations

import pytest

from engine.session import ChatEngine
from engine.settings import SamplingSettings, SpeculationSettings
from engine.stats import MIN_PLAIN_STEPS, GenerationStats


def stats(**fields) -> GenerationStats:
    base = dict(generated_tokens=100, total_time_s=6.0, prefill_time_s=1.0, target_step_time_s=0.1)
    return GenerationStats(**{**base, **fields})


def test_speedup_from_the_calibration_is_labelled_an_estimate():
    s = stats()
    assert s.speedup == 2.0 and s.speedup_is_estimate
    assert s.speedup_text() == "×2.00 (estimate)"
    assert s.to_dict()["speedup_is_estimate"] is True


def test_speedup_from_this_replys_own_plain_steps_is_measured():
    s = stats(plain_steps=MIN_PLAIN_STEPS, plain_step_time_s=MIN_PLAIN_STEPS * 0.08)
    assert abs(s.speedup - 1.6) < 1e-9 and not s.speedup_is_estimate
    assert s.speedup_text() == "×1.60 (measured in this reply)"
    few = stats(plain_steps=MIN_PLAIN_STEPS - 1, plain_step_time_s=0.5)
    assert few.speedup == 2.0  # too few plain steps: the calibration stays the baseline


def test_no_figure_without_a_baseline():
    s = stats(target_step_time_s=None)
    assert s.speedup is None and s.speedup_text() == "—"


def test_per_round_drafter_counts_and_derived_figures():
    s = stats(
        drafter_history=["ngram", "none", "ngram", "model:x"],
        per_position_drafted=[4, 2],
        per_position_accepted=[2, 2],
        accepted_lengths=[3, 1, 2, 1],
    )
    assert s.drafter_rounds == {"ngram": 2, "none": 1, "model:x": 1}
    data = s.to_dict()
    assert data["per_position_acceptance"] == [0.5, 1.0]
    assert data["mean_accepted_length"] == 1.75
    assert (
        GenerationStats(**{k: v for k, v in data.items() if k in GenerationStats.__dataclass_fields__}) == s
    )


def test_one_verdict_for_faster_slower_and_plain():
    """A reply that drafted in some rounds and then stepped plainly is judged by its speed-up, never
    called "decoded plainly"; only a reply that drafted nothing is."""
    partly = stats(drafter="auto", rounds=18, drafted=20, accepted=14, fallback_to_plain=True)
    partly.plain_steps, partly.plain_step_time_s = 10, 1.0  # 10 of its 18 rounds were plain steps
    assert partly.verdict == "faster" and partly.to_dict()["verdict"] == "faster"
    assert stats(drafter="auto", drafted=0, fallback_to_plain=True).verdict == "plain"
    assert stats(drafter="none").verdict == "target alone"
    assert stats(drafter="ngram", drafted=5, accepted=0).verdict == "none accepted"
    assert stats(drafter="ngram", drafted=5, accepted=2, total_time_s=30.0).verdict == "slower"
    assert stats(drafter="ngram", drafted=5, accepted=2, target_step_time_s=None).verdict == "unmeasured"


def timed(speedup: float) -> GenerationStats:
    """A reply that drafted, with plain steps of its own at 0.1 s a token and rounds `speedup` times
    cheaper per token."""
    return stats(
        drafter="ngram",
        rounds=40,
        drafted=60,
        accepted=30,
        plain_steps=MIN_PLAIN_STEPS,
        plain_step_time_s=MIN_PLAIN_STEPS * 0.1,
        round_tokens=100,
        round_time_s=10.0 / speedup,
    )


def test_within_three_percent_of_one_is_about_the_same_neither_faster_nor_slower():
    for figure in (0.97, 0.99, 1.00, 1.01, 1.03):
        assert timed(figure).verdict == "about the same", figure
    assert timed(1.04).verdict == "faster" and timed(0.96).verdict == "slower"
    assert timed(1.00).speedup == pytest.approx(1.0) and not timed(1.0).speedup_is_estimate


def test_the_speedup_is_the_rounds_cost_per_token_against_plain_rounds_timed_alike():
    """Not decode time over a calibration: every round (plain or drafted) is timed whole, and the
    reply's plain rounds are the baseline, so both carry the same overheads at the same moment."""
    s = timed(1.5)
    assert s.speedup == pytest.approx(1.5)
    s.target_step_time_s = 0.01  # a calibration taken at another moment no longer matters
    assert s.speedup == pytest.approx(1.5)


@pytest.fixture(scope="module")
def engine_on(target):
    def make(drafter: str, tokens: int = 24) -> ChatEngine:
        engine = ChatEngine(
            target,
            speculation=SpeculationSettings(drafter=drafter),
            sampling=SamplingSettings(max_new_tokens=tokens),
        )
        engine.prepare()
        return engine

    return make


def test_a_reply_of_the_target_alone_reads_one_by_construction(engine_on):
    """Under any load: the reply is its own baseline (the app once showed ×1.42 for `none` replies,
    against a baseline timed while the model loaded)."""
    reply = engine_on("none").generate_ids([5, 6, 7, 8]).stats
    assert reply.rounds > 0 and reply.plain_steps == reply.rounds and reply.drafted == 0
    assert reply.speedup == pytest.approx(1.0, abs=1e-9) and not reply.speedup_is_estimate
    assert reply.verdict == "target alone"


def test_a_reply_that_drafts_times_the_target_alone_inside_itself(engine_on, target):
    """A drafter that proposes every round still leaves a few plain rounds in the reply (the target
    alone at the same moment), so its figure is measured, not an estimate."""
    engine = engine_on("model", tokens=120)  # rounds of several tokens: enough for the probes
    engine.set_draft(target)  # the target drafting for itself: accepted every round
    reply = engine.generate_ids([5, 6, 7, 8]).stats
    assert reply.drafted > 0
    assert reply.plain_steps >= MIN_PLAIN_STEPS and not reply.speedup_is_estimate
    assert reply.round_tokens == reply.generated_tokens - 1  # the first token comes from the prompt


def rounds(times: list[float], kinds: list[int], kept: list[int]) -> GenerationStats:
    """A reply's stats as the loop records them round by round (record_round and time_round)."""
    plain = [t for t, k in zip(times, kinds, strict=True) if k == 0]
    return GenerationStats(
        rounds=len(times),
        k_history=list(kinds),
        accepted_lengths=list(kept),
        round_seconds=list(times),
        round_time_s=sum(times),
        round_tokens=sum(kept),
        plain_steps=len(plain),
        plain_step_time_s=sum(plain),
        generated_tokens=sum(kept),
        target_step_time_s=0.05,
    )


def test_a_stalled_round_counts_at_its_kinds_median_on_both_sides():
    """One plain step in four held up for ten steps' time: the reply ran x1.62 the target alone, and its
    sums read x3.46. Counted at its kind's median, the figure reads as the reply ran."""
    kinds = [0, 4, 4, 0, 4, 4, 0, 4, 4, 0, 4, 4]
    kept = [1 if k == 0 else 3 for k in kinds]
    quiet = rounds([0.030 if k == 0 else 0.050 for k in kinds], kinds, kept)
    busy = rounds([0.300] + quiet.round_seconds[1:], kinds, kept)
    assert quiet.speedup == pytest.approx(0.030 / (0.520 / 28))
    assert busy.speedup == pytest.approx(quiet.speedup)
    # the sums alone (a record kept before rounds were timed one by one) still take the stall in
    busy.round_seconds = []
    assert busy.speedup == pytest.approx(3.456, abs=1e-3)


def test_a_drafted_round_held_up_counts_at_the_median_of_rounds_that_drafted_as_many():
    kinds = [0, 4, 4, 0, 4, 4, 0, 4, 4, 0, 2, 2]
    kept = [1, 3, 3, 1, 3, 3, 1, 3, 3, 1, 2, 2]
    times = [0.030, 0.050, 0.050, 0.030, 0.500, 0.050, 0.030, 0.050, 0.050, 0.030, 0.040, 0.041]
    busy = rounds(times, kinds, kept)
    assert busy.steady_times() == pytest.approx((0.120, 0.120 + 0.050 * 6 + 0.081))
    # a round up to STALL_FACTOR times its kind's median is a round, not a stall: it counts as it ran
    slow = rounds([0.030, 0.050, 0.120] + times[3:], kinds, kept)
    assert slow.steady_times()[1] == pytest.approx(sum(slow.round_seconds) - 0.500 + 0.050)
