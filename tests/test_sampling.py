"""The accept/reject rule and the warpers, without a model."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from engine.decoding.sampling import (
    PositionNoise,
    accept_reject,
    coupled_accept,
    coupled_sample,
    exponential_draws,
    greedy_accept,
    one_hot,
    probs_from_logits,
    sample,
    warp_logits,
)
from engine.settings import SamplingSettings

V = 10


def tensors(*rows):
    return torch.tensor([list(rows)])


# --- exact cases -------------------------------------------------------------------------------


def test_greedy_perfect_match_gives_bonus():
    target_logits = one_hot(torch.tensor([[3, 5, 7, 2]]), V)  # argmaxes 3, 5, 7, then bonus 2
    num_accepted, next_token = greedy_accept(tensors(3, 5, 7), target_logits)
    assert (num_accepted.item(), next_token.item()) == (3, 2)


def test_greedy_early_mismatch_gives_target_token():
    target_logits = one_hot(torch.tensor([[3, 5, 7, 2]]), V)
    num_accepted, next_token = greedy_accept(tensors(3, 4, 7), target_logits)
    assert (num_accepted.item(), next_token.item()) == (1, 5)
    num_accepted, next_token = greedy_accept(tensors(9, 5, 7), target_logits)
    assert (num_accepted.item(), next_token.item()) == (0, 3)


def test_empty_draft_samples_from_target():
    target_probs = one_hot(torch.tensor([[6]]), V)  # [1, 1, V]
    empty = torch.zeros((1, 0), dtype=torch.long)
    num_accepted, next_token = accept_reject(empty, torch.zeros((1, 0, V)), target_probs)
    assert (num_accepted.item(), next_token.item()) == (0, 6)
    num_accepted, next_token = greedy_accept(empty, target_probs)
    assert (num_accepted.item(), next_token.item()) == (0, 6)


def test_one_hot_draft_and_target_reduce_to_greedy():
    generator = torch.Generator().manual_seed(0)
    target_tokens = torch.tensor([[3, 5, 7, 2]])
    for draft in ([3, 5, 7], [3, 4, 7], [0, 5, 7], [3, 5, 8]):
        draft_tokens = torch.tensor([draft])
        expected = greedy_accept(draft_tokens, one_hot(target_tokens, V))
        for _ in range(20):
            got = accept_reject(draft_tokens, one_hot(draft_tokens, V), one_hot(target_tokens, V), generator)
            assert (got[0].item(), got[1].item()) == (expected[0].item(), expected[1].item())


def test_one_hot_draft_rejected_token_never_recovered():
    """An n-gram draft (one-hot) that the target rejects: the recovered token is never the draft token."""
    generator = torch.Generator().manual_seed(1)
    target_probs = torch.full((1, 2, V), 1.0 / V)
    draft_tokens = torch.tensor([[4]]).expand(20000, 1)
    num_accepted, next_token = accept_reject(
        draft_tokens, one_hot(draft_tokens, V), target_probs.expand(20000, 2, V), generator
    )
    assert abs(num_accepted.float().mean().item() - 1.0 / V) < 0.01  # accepted with p_target(4) = 0.1
    assert not (next_token[num_accepted == 0] == 4).any()


def test_draft_token_with_zero_target_probability_is_always_rejected():
    target_probs = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])
    draft_probs = torch.tensor([[[0.5, 0.0, 0.5]]])
    for seed in range(10):
        num_accepted, next_token = accept_reject(
            torch.tensor([[2]]), draft_probs, target_probs, torch.Generator().manual_seed(seed)
        )
        assert (num_accepted.item(), next_token.item()) == (0, 1)


def test_equal_rows_guard_all_zero_residual():
    """draft == target and a rejection anyway (the draft token has probability 0 in both, as rounding
    can produce): the residual is all zero, and the guard samples from the target instead. Without
    it the recovered token comes from an all-zero row: token 0, which the target never emits."""
    probs = torch.tensor([[[0.0, 0.5, 0.5]]])
    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        num_accepted, next_token = accept_reject(
            torch.tensor([[0]]), probs, torch.cat([probs, probs], 1), generator
        )
        assert num_accepted.item() == 0 and next_token.item() in (1, 2)


# --- distribution ------------------------------------------------------------------------------


def random_distributions(generator, rows):
    """rows draws from the flat Dirichlet over V tokens, from `generator` (normalised Exp(1) draws)."""
    draws = torch.empty((rows, V)).exponential_(1.0, generator=generator)
    return draws / draws.sum(-1, keepdim=True)


def emitted_tokens(sampler, draft_probs, target_probs, n, generator):
    """n batched rounds with K = draft_probs.size(0); returns the first and second emitted tokens.

    draft_probs: [K, V], target_probs: [K+1, V], the same at every round (context-free toy models).
    """
    k = draft_probs.size(0)
    draft_tokens = torch.multinomial(draft_probs, n, replacement=True, generator=generator).T  # [n, K]
    num_accepted, next_token = sampler(
        draft_tokens, draft_probs.expand(n, k, V), target_probs.expand(n, k + 1, V), generator
    )
    first = torch.where(num_accepted > 0, draft_tokens[:, 0], next_token)
    has_second = num_accepted >= 1
    second = torch.where(num_accepted > 1, draft_tokens[:, 1], next_token)[has_second]
    return first, second


def always_accept(draft_tokens, draft_probs, target_probs, generator):
    """A broken sampler: accepts every draft token. The distribution test must catch it."""
    k = draft_tokens.size(1)
    bonus = sample(target_probs[:, k], generator)
    return torch.full((draft_tokens.size(0),), k), bonus


def matches_distribution(samples, probs) -> tuple[bool, float]:
    counts = torch.bincount(samples, minlength=V).double()
    keep = probs > 0
    assert counts[~keep].sum() == 0, "emitted a token the target gives probability 0"
    expected = probs.double()[keep] / probs.double()[keep].sum() * counts.sum()
    p_value = chisquare(counts[keep].numpy(), expected.numpy()).pvalue
    total_variation = 0.5 * (counts / counts.sum() - probs.double()).abs().sum().item()
    return bool(p_value > 0.001 and total_variation < 0.01), total_variation


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_emitted_tokens_follow_the_target_distribution(seed):
    generator = torch.Generator().manual_seed(seed)
    draft_probs = random_distributions(generator, 3)
    target_probs = random_distributions(generator, 4)
    first, second = emitted_tokens(accept_reject, draft_probs, target_probs, 100_000, generator)
    ok_first, tv_first = matches_distribution(first, target_probs[0])
    ok_second, tv_second = matches_distribution(second, target_probs[1])
    assert ok_first, tv_first
    assert ok_second, tv_second
    # a sparse target (top-k like) with a dense draft, and the reverse
    sparse = target_probs.clone()
    sparse[:, V // 2 :] = 0
    sparse /= sparse.sum(-1, keepdim=True)
    assert matches_distribution(
        emitted_tokens(accept_reject, draft_probs, sparse, 100_000, generator)[0], sparse[0]
    )[0]
    sparse_draft = sparse[:3]
    first = emitted_tokens(accept_reject, sparse_draft, target_probs, 100_000, generator)[0]
    assert matches_distribution(first, target_probs[0])[0]


def test_distance_shrinks_with_more_samples():
    generator = torch.Generator().manual_seed(5)
    draft_probs, target_probs = random_distributions(generator, 2), random_distributions(generator, 3)
    distances = []
    for n in (1_000, 100_000):
        first, _ = emitted_tokens(accept_reject, draft_probs, target_probs, n, generator)
        distances.append(matches_distribution(first, target_probs[0])[1])
    assert distances[1] < distances[0]


def test_negative_control_always_accept_is_detected():
    generator = torch.Generator().manual_seed(3)
    draft_probs, target_probs = random_distributions(generator, 3), random_distributions(generator, 4)
    first, _ = emitted_tokens(always_accept, draft_probs, target_probs, 100_000, generator)
    ok, total_variation = matches_distribution(first, target_probs[0])
    assert not ok, "the distribution test failed to catch a sampler that accepts every draft token"
    assert total_variation > 0.05


# --- determinism and warpers -------------------------------------------------------------------


def test_random_distributions_follow_their_generator():
    first = random_distributions(torch.Generator().manual_seed(7), 3)
    again = random_distributions(torch.Generator().manual_seed(7), 3)
    other = random_distributions(torch.Generator().manual_seed(8), 3)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert torch.allclose(first.sum(-1), torch.ones(3))


def test_seeded_generator_repeats_exactly():
    draft_probs = random_distributions(torch.Generator().manual_seed(0), 4).unsqueeze(0)
    target_probs = random_distributions(torch.Generator().manual_seed(1), 5).unsqueeze(0)
    draft_tokens = torch.tensor([[1, 2, 3, 4]])
    results = set()
    for _ in range(20):
        generator = torch.Generator().manual_seed(1234)
        rounds = [accept_reject(draft_tokens, draft_probs, target_probs, generator) for _ in range(10)]
        results.add(tuple((a.item(), b.item()) for a, b in rounds))
    assert len(results) == 1


def test_warpers():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    top_k = probs_from_logits(logits, SamplingSettings(temperature=1.0, top_k=2))
    assert (top_k[0, 2:] == 0).all() and torch.allclose(top_k.sum(), torch.tensor(1.0))
    softmax = logits.softmax(-1)[0]
    top_p = probs_from_logits(logits, SamplingSettings(temperature=1.0, top_p=float(softmax[0] + 0.01)))
    assert (top_p[0, :2] > 0).all() and (top_p[0, 2:] == 0).all()
    only_best = probs_from_logits(logits, SamplingSettings(temperature=1.0, top_p=0.01))
    assert only_best[0, 0] == 1.0
    hot = warp_logits(logits, SamplingSettings(temperature=2.0))
    assert torch.allclose(hot, logits / 2)
    greedy = probs_from_logits(logits, SamplingSettings(temperature=0.0))
    assert greedy.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]


def test_warp_logits_top_p_matches_a_direct_computation():
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn((3, 50), generator=generator)
    sampling = SamplingSettings(temperature=0.7, top_p=0.8)
    warped = warp_logits(logits, sampling)
    for row, kept in zip(logits / 0.7, torch.isfinite(warped), strict=True):
        probs, order = row.softmax(-1).sort(descending=True)
        before = probs.cumsum(-1) - probs
        expected = torch.zeros(50, dtype=torch.bool)
        expected[order[before < 0.8]] = True
        assert torch.equal(kept, expected)


# --- seeded (coupled) sampling -------------------------------------------------------------------


def coupled_emitted(draft_sampler, draft_probs, target_probs, n, seed):
    """n rounds with K = draft_probs.size(0) and noise from one PositionNoise per round start."""
    k = draft_probs.size(0)
    noise = PositionNoise(seed, "cpu")
    race = torch.stack([noise.race(1000 * i, k + 1, V) for i in range(n)])  # [n, K+1, V]
    draft_tokens = draft_sampler(draft_probs.expand(n, k, V), race[:, :k])  # [n, K]
    num_accepted, next_token = coupled_accept(draft_tokens, target_probs.expand(n, k + 1, V), race)
    first = torch.where(num_accepted > 0, draft_tokens[:, 0], next_token)
    second = torch.where(num_accepted > 1, draft_tokens[:, 1], next_token)[num_accepted >= 1]
    return first, second, num_accepted


def test_coupled_sampling_follows_the_target_distribution():
    generator = torch.Generator().manual_seed(11)
    draft_probs, target_probs = random_distributions(generator, 2), random_distributions(generator, 3)
    first, second, num_accepted = coupled_emitted(coupled_sample, draft_probs, target_probs, 30_000, 0)
    assert matches_distribution(first, target_probs[0])[0]
    assert matches_distribution(second, target_probs[1])[0]
    assert num_accepted.float().mean() > 0.2  # drafts sampled with the same noise are often kept


def test_coupled_negative_control_always_accept_is_detected():
    generator = torch.Generator().manual_seed(12)
    draft_probs, target_probs = random_distributions(generator, 2), random_distributions(generator, 3)
    n, noise = 30_000, PositionNoise(0, "cpu")
    race = torch.stack([noise.race(1000 * i, 3, V) for i in range(n)])
    draft_tokens = coupled_sample(draft_probs.expand(n, 2, V), race[:, :2])
    ok, total_variation = matches_distribution(draft_tokens[:, 0], target_probs[0])
    assert not ok and total_variation > 0.05


def test_position_noise_depends_only_on_seed_and_position():
    noise = PositionNoise(5, "cpu")
    a = noise.race(10, 4, V)
    noise.race(0, 7, V)  # other draws in between change nothing
    assert torch.equal(noise.race(12, 2, V), a[2:])
    assert torch.equal(PositionNoise(5, "cpu").race(10, 4, V), a)
    assert not torch.equal(PositionNoise(6, "cpu").race(10, 4, V), a)


def test_position_noise_keeps_a_bounded_number_of_rows_and_draws_a_dropped_one_again_alike():
    noise = PositionNoise(5, "cpu")
    first = noise.race(0, 1, V)
    noise.race(1, PositionNoise.KEEP + 10, V)
    assert len(noise._rows) == PositionNoise.KEEP
    assert (0, V) not in noise._rows
    assert torch.equal(noise.race(0, 1, V), first)


def test_exponential_draws_have_the_exp1_mean_and_variance_and_are_never_zero():
    draws = exponential_draws(1_000_000, torch.Generator().manual_seed(0), "cpu")
    assert bool((draws > 0).all())
    assert abs(float(draws.mean()) - 1.0) < 0.005 and abs(float(draws.var()) - 1.0) < 0.01
