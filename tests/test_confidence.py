"""A model draft that stops where its own confidence says the next token would not pay."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from engine.decoding.confidence import ConfidenceCalibration, StopRule
from engine.decoding.drafters.head import HeadDrafter
from engine.decoding.sampling import accept_reject
from tests.test_head import V_SMALL as V
from tests.test_head import sampling_setup

FLAT = [0.030, 0.031, 0.032, 0.033, 0.034, 0.035]  # t(1)..t(6): a CPU whose verify of 2-6 costs ~1 step
STEEP = [0.030, 0.060, 0.090, 0.120, 0.150, 0.180]  # each verified token costs a whole step


def test_calibration_starts_at_the_confidence_and_learns_what_rounds_kept():
    calibration = ConfidenceCalibration()
    assert calibration.rate(0.95) == pytest.approx(0.95)
    assert calibration.rate(0.15) == pytest.approx(0.15)
    for _ in range(200):  # confident tokens the target always rejects
        calibration.observe([0.95], accepted=0)
    assert calibration.rate(0.95) < 0.05
    assert calibration.rate(0.15) == pytest.approx(0.15), "one bin's outcomes moved another"


def test_tokens_after_the_first_rejected_one_are_not_counted():
    calibration = ConfidenceCalibration()
    for _ in range(200):  # the first token kept, the second rejected, the third never decided
        calibration.observe([0.95, 0.55, 0.15], accepted=1)
    assert calibration.rate(0.95) > 0.95
    assert calibration.rate(0.55) < 0.05
    assert calibration.rate(0.15) == pytest.approx(0.15)


def test_a_confident_draft_goes_on_where_verifying_more_is_cheap():
    rule = StopRule(ConfidenceCalibration(), FLAT, draft_step_s=0.003)
    assert rule.keep(0, 0.95) and rule.go_on(0)
    assert rule.keep(1, 0.92) and rule.go_on(1)


def test_an_unsure_token_is_not_verified_where_each_token_costs_a_step():
    assert not StopRule(ConfidenceCalibration(), STEEP, draft_step_s=0.003).keep(0, 0.15)
    # the same token is worth verifying where the verify is nearly free
    assert StopRule(ConfidenceCalibration(), FLAT, draft_step_s=0.003).keep(0, 0.15)
    # a confident first token is worth it even there, but drafting on at that rate is not
    rule = StopRule(ConfidenceCalibration(), STEEP, draft_step_s=0.003)
    assert rule.keep(0, 0.95)


def test_a_draft_step_dearer_than_what_it_adds_stops_the_draft():
    rule = StopRule(ConfidenceCalibration(), FLAT, draft_step_s=0.003)
    assert rule.keep(0, 0.55)
    assert rule.go_on(0)
    costly = StopRule(ConfidenceCalibration(), FLAT, draft_step_s=0.030)
    assert costly.keep(0, 0.55)
    assert not costly.go_on(0)


# --- exactness: the emitted tokens follow the target although the draft length varies ----------------


class DroppingHeadDrafter(HeadDrafter):
    """Negative control: keeps its second token only when that token is its likeliest one, a stop decided
    by the token drawn rather than by the distribution it was drawn from."""

    def propose(self, context, k):
        draft = super().propose(context, k)
        if len(draft.tokens) == 2 and draft.probs[1].argmax() != draft.tokens[1]:
            draft.tokens, draft.probs = draft.tokens[:1], draft.probs[:1]
        return draft


def emitted_pairs(drafter_class, runs: int, builtin_tokenizer, verify_s=(1.0, 1.0, 1.04, 1.04)):
    """`runs` rounds from one context with a head whose stop rule keeps a second token only where the
    head is confident of it. Returns the first two tokens emitted (the second drawn from the target
    alone when the round emitted one), the target's exact marginals for them, and the draft lengths."""
    setup = sampling_setup(drafter_class, builtin_tokenizer)
    drafter, context, features = setup.drafter, setup.context, setup.features
    first, after = setup.first, setup.after
    after2 = {}
    generator = torch.Generator().manual_seed(2)
    pairs, lengths = [], []
    for _ in range(runs):
        drafter.reset()
        drafter.observe_target((0, features[: len(context) - 1]), context)
        # token 0 is always worth it (t(2) = t(1)); token 1 only where the head is confident enough
        drafter.stop_rule = StopRule(ConfidenceCalibration(), list(verify_s), draft_step_s=0.0)
        draft = drafter.propose(context, 2)
        tokens = draft.tokens.tolist()
        lengths.append(len(tokens))
        rows = [first] + [after[tokens[0]]]
        if len(tokens) == 2:
            if tuple(tokens) not in after2:
                after2[tuple(tokens)] = setup.target_probs(context + tokens)
            rows.append(after2[tuple(tokens)])
        accepted, next_token = accept_reject(
            draft.tokens[None], draft.probs[None], torch.stack(rows[: len(tokens) + 1])[None], generator
        )
        emitted = (tokens[: int(accepted)] + [int(next_token)])[:2]
        if len(emitted) == 1:  # the round emitted one token: the target alone draws the next
            emitted.append(int(torch.multinomial(after[emitted[0]], 1, generator=generator)))
        pairs.append(emitted)
    pairs = torch.tensor(pairs)
    second = sum(first[d] * after[d] for d in range(V))
    return pairs[:, 0], pairs[:, 1], first, second, lengths


def chi_square_p(samples, probs):
    counts = torch.bincount(samples, minlength=V).double()
    expected = probs.double() * counts.sum()
    keep = expected > 0
    return chisquare(
        counts[keep].numpy(), (expected[keep] * counts[keep].sum() / expected[keep].sum()).numpy()
    ).pvalue


def test_a_draft_stopped_by_its_confidence_keeps_the_targets_distribution(builtin_tokenizer):
    torch.manual_seed(0)
    first, second, first_exact, second_exact, lengths = emitted_pairs(HeadDrafter, 3000, builtin_tokenizer)
    assert 0.1 < lengths.count(1) / len(lengths) < 0.9, "the stop rule never varied the draft's length"
    assert chi_square_p(first, first_exact) > 1e-3
    assert chi_square_p(second, second_exact) > 1e-3

    torch.manual_seed(0)
    _, broken, _, _, _ = emitted_pairs(DroppingHeadDrafter, 6000, builtin_tokenizer, (1.0, 1.0, 1.0, 1.0))
    assert chi_square_p(broken, second_exact) < 1e-3, "the test missed a stop decided by the token drawn"
