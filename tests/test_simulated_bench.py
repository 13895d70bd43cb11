"""The simulated-acceptance bench mode (engine.bench.simulated): its replacement rule, its bound, and
a real run on the built-in file with itself as a separate GGUF draft model."""

from __future__ import annotations

import random

import pytest
import torch

from engine.bench.simulated import Simulation, bound, run


def test_tokens_are_the_targets_own_at_rate_alpha_and_another_token_otherwise():
    reference = list(range(100, 1100))
    simulation = Simulation(reference, 0.7, 5000, random.Random(0))
    kept = total = 0
    for start in range(10, 900, 9):
        context = reference[:start]
        out = simulation.replace(context, torch.zeros(8, dtype=torch.long))
        for i, token in enumerate(out.tolist()):
            own = reference[start + i]
            assert 0 <= token < 5000
            kept += token == own
            total += 1
    assert abs(kept / total - 0.7) < 0.05
    never = Simulation(reference, 0.0, 5000, random.Random(1)).replace(
        reference[:5], torch.zeros(4, dtype=torch.long)
    )
    assert all(t != r for t, r in zip(never.tolist(), reference[5:9], strict=True))


def test_the_bound_is_the_best_k_of_tokens_per_round_over_cost_per_round():
    flat = {n: 1.0 for n in range(1, 10)}  # a verify as cheap as a step, free drafts: K = 8 wins
    value, k = bound(0.8, 0.0, flat)
    assert k == 8 and value == pytest.approx((1 - 0.8**9) / 0.2)
    # a verify of n tokens costing n steps and a draft step costing one: drafting never pays
    assert bound(0.7, 1.0, {n: float(n) for n in range(1, 10)})[0] == 1.0


@pytest.mark.slow
def test_a_simulated_run_keeps_the_targets_output_and_the_acceptance_it_was_given():
    from engine.models.builtin import DEFAULT_TARGET, builtin_entry, builtin_gguf_path

    gguf = builtin_gguf_path(builtin_entry(DEFAULT_TARGET))
    result = run(gguf, gguf, [0.0, 1.0], tokens=24, k=3)  # fixed K: this draft costs a whole step
    never, always = result["rows"]
    assert never["identical_to_target_alone"] and always["identical_to_target_alone"]
    assert never["kept_per_drafted"] in (0.0, None)
    assert always["kept_per_drafted"] == 1.0 and always["tokens_per_round"] > 3
    assert result["label"] == "simulated acceptance"
