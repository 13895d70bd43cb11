"""GenerationStats: the one source of the speed figures every view shows."""

from __future__ import annotations

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
    s = stats(drafter_history=["ngram", "none", "ngram", "model:x"], per_position_drafted=[4, 2],
              per_position_accepted=[2, 2], accepted_lengths=[3, 1, 2, 1])  # fmt: skip
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
