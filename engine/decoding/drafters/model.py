"""A smaller (or quantized) causal LM as the draft, with its own KV cache."""

from __future__ import annotations

import threading
import time

import torch

from engine.decoding.drafters.base import Cancelled, Draft, common_prefix_length, empty_draft
from engine.decoding.sampling import coupled_sample, probs_from_logits, sample
from engine.runtime.cache_transfer import copy_cache
from engine.runtime.protocol import Runner
from engine.settings import SamplingSettings

# a prior, not a certainty: one rejected token must still move it
MAX_PRIOR = 0.98
# The check's figure counts as this many rounds. At the weight of a guess (1), a first round that
# drafted two tokens and lost the second halved the second position's estimate, and adaptive K held
# a copy kept 96 % of the time at K = 1 for the rest of the reply: rounds of one token never decide
# the second position again (traced in a fresh start's first reply: ten such rounds in a row).
CHECKED_PRIOR_WEIGHT = 4.0


def copy_acceptance_prior(target, draft) -> tuple[float, float] | None:
    """(p_0, p_after_accept) adaptive K starts from for `draft` (LoadedModels), where it is a quantized
    copy of the float target: its check against the float model on probe text (engine.kernels.quant_check)
    measured top-1 agreement, which is the share of its greedy tokens the target keeps. Without it
    a copy kept 96 % of the time started from a coin flip, and on a fresh start `auto` let the
    draft head, whose first rounds happened to be kept, draft the first dozen rounds of the first
    reply. None for any other draft: its check compared it with its own float model, not the target."""
    agreement = (draft.info.get("kernel_check") or {}).get("agreement")
    if draft.spec != target.spec or target.quantization != "none" or not agreement:
        return None
    prior = min(float(agreement), MAX_PRIOR)
    return prior, prior


class ModelDrafter:
    """A smaller causal LM (possibly quantized) with its own KV cache, sampling with the target's warpers.
    A Drafter that begins requests, reads prompts and knows its acceptance."""

    # its proposals catch up on whatever tokens it skipped, a prompt included
    prompt_can_wait = True

    def __init__(
        self,
        runner: Runner,
        target_vocab_size: int,
        name: str = "draft",
        target_device=None,
        cache_donor: Runner | None = None,
        acceptance_prior: tuple[float, float] | None = None,
    ):
        """`cache_donor`: the target's runner, where its cache layout is the draft's (a quantized copy,
        engine.runtime.cache_transfer): the draft then reads skipped tokens, a prompt above all, from it.
        `acceptance_prior`: what adaptive K assumes before measuring, from a quantized copy's check
        (copy_acceptance_prior), worth CHECKED_PRIOR_WEIGHT rounds."""
        self.acceptance_prior = acceptance_prior
        self.acceptance_prior_weight = CHECKED_PRIOR_WEIGHT if acceptance_prior is not None else 1.0
        self.runner = runner
        self.cache_donor = cache_donor
        self.target_vocab_size = target_vocab_size
        # drafts are handed to the target on its device (the draft may run on another one)
        self.target_device = torch.device(target_device) if target_device is not None else runner.device
        self.name = f"model:{name}"
        self.cached_tokens: list[int] = []  # a prefix of what the runner's cache holds
        self._pending: tuple[list[int], int] | None = None  # (context, draft tokens fed to the cache)
        self._catch_up_s = 0.0  # the last catch-up's seconds, when it read skipped tokens
        self.begin(SamplingSettings(), None)

    def begin(
        self, sampling, generator, cancel: threading.Event | None = None, p_min: float = 0.0, noise=None
    ) -> None:
        """`generator` is the request's (on the target's device); the draft samples with its own
        generator on its own device, seeded from the request's so a seeded run repeats."""
        self.sampling, self.cancel, self.p_min, self.noise = sampling, cancel, p_min, noise
        self.generator = generator
        if generator is not None and torch.device(generator.device) != self.runner.device:
            self.generator = torch.Generator(device=self.runner.device)
            self.generator.manual_seed(generator.initial_seed() + 1)
        self._pending = None

    def reset(self) -> None:
        self.runner.reset()
        self.cached_tokens = []

    def propose(self, context: list[int], k: int) -> Draft:
        k = min(k, self.runner.context_length - len(context))
        if k <= 0:
            return empty_draft(self.target_vocab_size, self.target_device)
        logits = self._catch_up(context)  # [V_draft]
        catch_up_s = self._catch_up_s
        tokens, probs, fed = [], [], 0
        for i in range(k):
            if self.p_min > 0 and self._confidence(logits) < self.p_min:
                break
            if self.sampling.greedy:
                token = logits[: self.target_vocab_size].argmax()  # []
            else:
                draft_probs = self._target_width(probs_from_logits(logits, self.sampling))  # [V]
                if self.noise is not None:  # seeded: the noise the target samples this index with
                    race = self.noise.race(len(context) + i, 1, draft_probs.size(-1))[0]
                    token = coupled_sample(draft_probs, race.to(draft_probs.device))  # []
                else:
                    token = sample(draft_probs, self.generator)  # []
                probs.append(draft_probs)
            tokens.append(token)
            if i + 1 < k:
                self._check_cancel()
                logits = self.runner.forward(token.view(1))[-1]
                fed += 1
        self._pending = (context, fed)
        if not tokens:
            return empty_draft(self.target_vocab_size, self.target_device, catch_up_s)
        return Draft(
            torch.stack(tokens).to(self.target_device),
            torch.stack(probs).to(self.target_device) if probs else None,
            catch_up_s,
        )

    def prefill(self, context: list[int]) -> None:
        if len(context) > 1:
            self._catch_up(context)

    def update(self, accepted: list[int]) -> None:
        """The cache holds context + the draft tokens fed back (all but the last, or all of them when
        p_min stopped the draft early); keep context + the accepted part of that."""
        if self._pending is None:
            return
        context, fed = self._pending
        self._pending = None
        kept = context + accepted[:fed]
        self.runner.rollback(len(kept))
        self.cached_tokens = kept

    def _catch_up(self, context: list[int]) -> torch.Tensor:
        """Bring the cache to exactly `context` (reusing the longest common prefix); the last logits: [V].
        `_catch_up_s`: the seconds it took where it read tokens the drafter had skipped, else 0."""
        keep = min(
            common_prefix_length(self.cached_tokens, context), len(context) - 1, self.runner.cache_length
        )
        self.runner.rollback(keep)
        self._check_cancel()
        started, self._catch_up_s = time.perf_counter(), 0.0
        if self.cache_donor is not None and len(context) - keep > 2:
            # the target's cache holds context[: donor.cache_length] whenever a drafter is asked
            keep = copy_cache(self.cache_donor, self.runner, keep, len(context) - 1)
        logits = self.runner.prefill(context[keep:])
        # A round's catch-up reads at most the last accepted token and the target's own token; more
        # means the drafter sat out plain rounds (or is reading a new prompt).
        if len(context) - keep > 2:
            self.runner.synchronize()
            self._catch_up_s = time.perf_counter() - started
        self.cached_tokens = list(context)
        return logits

    def _target_width(self, probs: torch.Tensor) -> torch.Tensor:
        """Pads or cuts the draft vocabulary to the target's (they may differ by padding rows). A cut
        is renormalised: the draft then samples from, and is judged by, the same distribution."""
        extra = self.target_vocab_size - probs.size(-1)
        if extra > 0:
            return torch.nn.functional.pad(probs, (0, extra))
        if extra < 0:
            probs = probs[..., : self.target_vocab_size]
            return probs / probs.sum(dim=-1, keepdim=True).clamp_min(1e-30)
        return probs

    def _confidence(self, logits: torch.Tensor) -> float:
        """The draft's top probability (after the warpers when sampling)."""
        probs = logits.softmax(-1) if self.sampling.greedy else probs_from_logits(logits, self.sampling)
        return float(probs.max())  # a host sync per draft step, only when p_min is on

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled
