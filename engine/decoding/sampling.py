"""Logits warpers and the accept/reject rule of speculative decoding.

Both models go through the same warpers (temperature, then top-k, then top-p), so the draft and the
target distributions compared in `accept_reject` are the ones each model would really sample from.

Vocabulary (as in vLLM's rejection sampler):
  accepted  - a draft token the target keeps;
  recovered - at the first rejected position, a token sampled from the residual distribution;
  bonus     - after all K draft tokens are accepted, one more token sampled from the target.
Every round therefore emits `num_accepted + 1` tokens.

Two exact rules for sampling:
  accept_reject  - rejection sampling; the best acceptance for a sampled draft. Its random draws per
                   round depend on K, so a seeded run repeats only if K repeats.
  coupled_accept - a seeded request: every token the target emits at context index p is
                   argmax(target_probs / E_p), E_p ~ Exp(1) drawn from (seed, p) alone
                   (`PositionNoise`); a draft token is accepted when it equals that token. The output
                   is the target's own sample whatever K or drafter each round used, so a seeded
                   run repeats exactly under adaptive K. A one-hot (lookup) draft is accepted with
                   probability target_probs[x], as under accept_reject; a model draft that samples
                   with the same E_p is accepted a little less often than under rejection sampling.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from engine.settings import SamplingSettings


def warp_logits(logits: torch.Tensor, sampling: SamplingSettings) -> torch.Tensor:
    """Temperature, top-k and top-p, in that order (as transformers does). logits: [..., V] -> [..., V]."""
    logits = logits.float() / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < logits.size(-1):
        kth_best = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # drop a token when the tokens ranked above it already cover top_p; the best token always stays
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= sampling.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probs_from_logits(logits: torch.Tensor, sampling: SamplingSettings) -> torch.Tensor:
    """The distribution a model samples from. Greedy gives the one-hot of the argmax. [..., V] -> [..., V]."""
    if sampling.greedy:
        return one_hot(logits.argmax(dim=-1), logits.size(-1))
    return warp_logits(logits, sampling).softmax(dim=-1)


def one_hot(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """tokens: [...] long -> [..., V] float32 with a 1 at each token."""
    return torch.nn.functional.one_hot(tokens, vocab_size).float()


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row, without a host sync. probs: [..., V] -> [...] long.

    argmax(probs / E) with E ~ Exp(1) draws index i with probability probs[i] (the exponential race).
    """
    return torch.argmax(probs / exponential_draws(probs.shape, generator, probs.device), dim=-1)


def exponential_draws(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Exp(1) draws as -log(U), U uniform in [0, 1): never 0 (U < 1), and U = 0 gives inf, which only
    takes a token out of one race. On a CPU, torch's own exponential_ is a scalar loop: 2.6 ms for
    one row of a 49,152-token vocabulary, 7 % of the built-in model's decoding step; this is a
    vectorized uniform draw and a logarithm."""
    return torch.rand(shape, generator=generator, device=device).log_().neg_()


class PositionNoise:
    """Counter-based noise for seeded sampling: the Exp(1) race for context index p depends only on
    (seed, p), never on how many numbers earlier rounds drew.

    The last KEEP rows drawn are kept: a draft head draws its token at index p with the race the
    target's verify then needs at p, and positions verified past a rejection come back in the next
    round, so each index's row is drawn once."""

    KEEP = 64  # rows of V floats (49,152 tokens: 12 MB)

    def __init__(self, seed: int, device):
        self.seed, self.device = seed, torch.device(device)
        self._generator = torch.Generator(device=self.device)
        self._rows: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()

    def race(self, start: int, count: int, vocab_size: int) -> torch.Tensor:
        """Noise for context indices start..start+count-1: [count, V] float32."""
        rows = [self._row(position, vocab_size) for position in range(start, start + count)]
        return torch.stack(rows) if rows else torch.zeros((0, vocab_size), device=self.device)

    def _row(self, position: int, vocab_size: int) -> torch.Tensor:
        key = (position, vocab_size)
        row = self._rows.get(key)
        if row is None:
            self._generator.manual_seed((self.seed * 1_000_003 + position) % (2**63 - 1))
            row = self._rows[key] = exponential_draws(vocab_size, self._generator, self.device)
            if len(self._rows) > self.KEEP:
                self._rows.popitem(last=False)
        return row


def coupled_sample(probs: torch.Tensor, race: torch.Tensor) -> torch.Tensor:
    """The exponential race with given noise: [..., V], [..., V] -> [...] long."""
    return torch.argmax(probs / race, dim=-1)


def coupled_accept(
    draft_tokens: torch.Tensor, target_probs: torch.Tensor, race: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded verification (see the module docstring): the target samples every position with its
    position's noise, and draft tokens are kept while they equal those samples.

    draft_tokens: [B, K] long; target_probs: [B, K+1, V]; race: [B, K+1, V] Exp(1) noise
    returns (num_accepted [B] long, next_token [B] long)
    """
    target_tokens = coupled_sample(target_probs, race)  # [B, K+1]
    return _first_rejection(draft_tokens == target_tokens[:, :-1], target_tokens)


def greedy_accept(
    draft_tokens: torch.Tensor, target_logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: keep draft tokens while they equal the target's argmax.

    draft_tokens:  [B, K] long
    target_logits: [B, K+1, V]; row i scores the token after draft token i-1 (row 0: after the context)
    returns (num_accepted [B] long, next_token [B] long): the target's argmax at the first mismatch,
    or its bonus token at row K when all K were accepted.
    """
    target_tokens = target_logits.argmax(dim=-1)  # [B, K+1]
    return _first_rejection(draft_tokens == target_tokens[:, :-1], target_tokens)


def accept_reject(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al. 2023, arXiv 2211.17192, Algorithm 1; Chen et al. 2023).

    draft_tokens: [B, K] long, draft token i was sampled from draft_probs[:, i]
    draft_probs:  [B, K, V] the (warped) draft distributions; one-hot for deterministic drafters
    target_probs: [B, K+1, V] the (warped) target distributions at the same positions, plus one more
    returns (num_accepted [B] long, next_token [B] long)

    For i = 0..K-1, with x = draft_tokens[i]:
        accept x with probability min(1, target_probs[i, x] / draft_probs[i, x]);
        at the first rejection, emit a recovered token sampled from
            residual = normalize(max(0, target_probs[i] - draft_probs[i]))
        and stop. If all K are accepted, emit a bonus token sampled from target_probs[K].
    Every emitted token is then distributed exactly as the target alone would sample it.
    If a residual is all zero (the two rows are equal, so a rejection has probability 0 and only
    rounding can land there), fall back to target_probs[i].

    Everything is computed without a host sync, so the caller needs one for the result; one row of
    vocabulary-sized noise is drawn, for the one token sampled.
    """
    batch, k = draft_tokens.shape
    assert draft_probs.shape[:2] == (batch, k), (draft_probs.shape, draft_tokens.shape)
    assert target_probs.shape[:2] == (batch, k + 1) and target_probs.size(-1) == draft_probs.size(-1)

    index = draft_tokens.unsqueeze(-1)  # [B, K, 1]
    draft_p = draft_probs.gather(-1, index).squeeze(-1)  # [B, K]
    target_p = target_probs[:, :k].gather(-1, index).squeeze(-1)  # [B, K]
    uniform = torch.rand(draft_p.shape, generator=generator, device=draft_p.device)  # [B, K]
    # u < target_p / draft_p, written without a division so that draft_p == 0 cannot produce nan
    accepted = uniform * draft_p < target_p  # [B, K]

    num_accepted = _accepted_prefix(accepted)  # [B]
    # Only the row the emitted token comes from is sampled: the recovered token's residual at the
    # first rejection, or the bonus token's target row after K acceptances (an all-zero draft row).
    at = num_accepted.view(-1, 1, 1).expand(-1, 1, target_probs.size(-1))  # [B, 1, V]
    target_row = target_probs.gather(1, at).squeeze(1)  # [B, V]
    draft_row = torch.zeros_like(target_row)
    if k > 0:
        kept_all = (num_accepted == k).unsqueeze(-1)  # [B, 1]
        draft_row = draft_probs.gather(1, at.clamp(max=k - 1)).squeeze(1).masked_fill(kept_all, 0.0)
    residual = (target_row - draft_row).clamp_min(0.0)  # [B, V]
    residual_mass = residual.sum(dim=-1, keepdim=True)  # [B, 1]
    residual = torch.where(residual_mass > 0, residual / residual_mass.clamp_min(1e-30), target_row)
    return num_accepted, sample(residual, generator)


def _first_rejection(accepted: torch.Tensor, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """accepted: [B, K] bool, candidates: [B, K+1] long -> (num_accepted [B], candidates[b, num_accepted[b]])."""
    num_accepted = _accepted_prefix(accepted)  # [B]
    next_token = candidates.gather(-1, num_accepted.unsqueeze(-1)).squeeze(-1)  # [B]
    return num_accepted, next_token


def _accepted_prefix(accepted: torch.Tensor) -> torch.Tensor:
    """accepted: [B, K] bool -> [B] long, the number of leading True."""
    return accepted.long().cumprod(dim=-1).sum(dim=-1)
