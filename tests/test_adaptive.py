"""Adaptive K: the verify-cost curve and the choice of K."""

from __future__ import annotations

import pytest

from engine.decoding.adaptive import KController, VerifyCostCurve, expected_tokens
from engine.settings import SpeculationSettings


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


def controller(alpha, draft_step_s, curve, **settings):
    k = KController(SpeculationSettings(**settings), curve)
    k.accepted_weight, k.decided_weight = alpha * 10, 10.0
    k.draft_step_s = draft_step_s
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


def test_recovers_when_acceptance_rises():
    k = controller(0.3, 0.01, curve_of({1: 0.1, 2: 0.143, 5: 0.24}))
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
    assert KController(SpeculationSettings(max_k=8), VerifyCostCurve()).choose(limit=100) == 4


def test_one_noisy_measurement_cannot_make_short_drafts_look_expensive():
    """A forward over 2 tokens measured during a load spike must not cost more than one over 4,
    nor more than 2 single steps; otherwise adaptive K would refuse K=1 for no real reason."""
    curve = curve_of({1: 0.10, 2: 0.90, 4: 0.15, 8: 5.0})
    assert curve.estimate(2) == pytest.approx(0.15)
    assert curve.estimate(3) == pytest.approx(0.15)
    assert curve.estimate(8) == pytest.approx(0.80)  # at most 8 single steps
    assert curve.estimate(1) == pytest.approx(0.10)
    assert curve.estimate(4) >= curve.estimate(1)
