"""Choosing K, the number of draft tokens per round, from what this device measures.

With per-token acceptance rate a, a round that drafts K tokens emits on average
    E(K) = (1 - a^(K+1)) / (1 - a)            tokens (accepted drafts + one target token)
and costs K * t_draft + t_verify(K+1): K draft steps, then one target forward over the last
token and the K drafts. Plain decoding emits 1 token per t_verify(1). We pick the K in 0..max_k
with the best tokens per second. t_verify(n) is not flat (on a CPU in eager mode a forward over 5
new tokens costs about 2.4 single steps), so it is a measured curve, not a constant.
"""

from __future__ import annotations

import time
from bisect import bisect_left

from engine.settings import SpeculationSettings

# Before two sizes are measured, assume each extra token verified adds this fraction of a single step.
PRIOR_COST_PER_EXTRA_TOKEN = 0.35


class VerifyCostCurve:
    """t(n): seconds for one target forward over n new tokens (warm cache), as a running average per n.

    Sizes never measured are interpolated linearly between measured neighbours, or extrapolated from
    the two largest. `measure` fills it directly; a compiled runner can call it again after compiling.
    """

    def __init__(self, decay: float = 0.8):
        self.decay = decay
        self.seconds: dict[int, float] = {}

    def observe(self, n: int, seconds: float) -> None:
        old = self.seconds.get(n)
        self.seconds[n] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds

    def estimate(self, n: int) -> float | None:
        """t(n), kept physically sane so that one noisy measurement cannot mislead adaptive K:
        a forward over more tokens never costs less than one over fewer (so t(n) is at most the
        cheapest measurement at n or above), and never more than n single steps."""
        estimate = self._interpolate(n)
        if estimate is None:
            return None
        at_or_above = [seconds for m, seconds in self.seconds.items() if m >= n]
        if at_or_above:
            estimate = min(estimate, min(at_or_above))
        single = self.seconds.get(1)
        if single is not None:
            estimate = min(max(estimate, single), n * single)
        return estimate

    def _interpolate(self, n: int) -> float | None:
        if n in self.seconds:
            return self.seconds[n]
        sizes = sorted(self.seconds)
        if not sizes:
            return None
        if len(sizes) == 1 or n < sizes[0]:
            nearest = min(sizes, key=lambda m: abs(m - n))
            return self.seconds[nearest] * prior_shape(n) / prior_shape(nearest)
        i = bisect_left(sizes, n)
        lo, hi = (sizes[-2], sizes[-1]) if i == len(sizes) else (sizes[i - 1], sizes[i])
        slope = max((self.seconds[hi] - self.seconds[lo]) / (hi - lo), 0.0)
        return self.seconds[lo] + slope * (n - lo)

    def measure(self, runner, sizes=(1, 2, 4, 8), repeats: int = 5) -> VerifyCostCurve:
        """Times forwards over n new tokens on `runner` (its cache must hold some context), then rolls back."""
        length = runner.cache_length
        for n in sizes:
            if length + n > runner.context_length:
                break
            times = []
            for _ in range(repeats + 1):  # the first run warms up this shape
                start = time.perf_counter()
                runner.forward([0] * n)
                runner.synchronize()
                times.append(time.perf_counter() - start)
                runner.rollback(length)
            # the fastest run: other load on the machine only ever adds time
            self.seconds[n] = min(times[1:])
        return self

    def to_dict(self) -> dict[int, float]:
        return dict(sorted(self.seconds.items()))


def prior_shape(n: int) -> float:
    """Cost of a forward over n tokens in single steps, before measurements say otherwise."""
    return 1.0 + PRIOR_COST_PER_EXTRA_TOKEN * (n - 1)


def expected_tokens(alpha: float, k: int) -> float:
    """E(K) = 1 + a + ... + a^K: accepted draft tokens plus the target's own token."""
    if alpha >= 1.0 - 1e-9:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class KController:
    """Fixed K, or adaptive K with a fallback to plain decoding that re-probes now and then."""

    def __init__(
        self,
        speculation: SpeculationSettings,
        curve: VerifyCostCurve,
        probe_every: int = 32,
        decay: float = 0.9,
    ):
        self.speculation, self.curve = speculation, curve
        self.probe_every, self.decay = probe_every, decay
        # decayed counts of accepted and of decided draft tokens; the prior is a = 0.5 worth 2 tokens
        self.accepted_weight, self.decided_weight = 1.0, 2.0
        self.draft_step_s: float | None = None
        self.plain = False  # adaptive mode decided that speculation is slower here
        self._plain_rounds = 0

    @property
    def alpha(self) -> float:
        return self.accepted_weight / self.decided_weight

    def choose(self, limit: int) -> int:
        """K for the next round, at most `limit` (tokens left); 0 means a plain step."""
        if not self.speculation.adaptive:
            return max(0, min(self.speculation.k, limit))
        best_k, best_rate, plain_rate = self._best()
        self.plain = best_k is not None and best_rate <= plain_rate
        if self.plain:
            self._plain_rounds += 1
            if self._plain_rounds % self.probe_every != 0:
                return 0
        if best_k is None:  # nothing measured yet: a first probe
            best_k = min(4, self.speculation.max_k)
        return max(0, min(best_k, limit))

    def observe(self, k: int, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """One round: `drafted` tokens proposed (<= k), `accepted` kept; times in seconds."""
        self.curve.observe(drafted + 1, verify_s)
        if drafted == 0:
            return
        rejected_one = (
            1 if accepted < drafted else 0
        )  # positions after the first rejection were never decided
        self.accepted_weight = self.decay * self.accepted_weight + accepted
        self.decided_weight = self.decay * self.decided_weight + accepted + rejected_one
        step = draft_s / drafted
        self.draft_step_s = step if self.draft_step_s is None else 0.8 * self.draft_step_s + 0.2 * step

    def expected_rate(self, k: int) -> float | None:
        """Tokens per second expected with K = k."""
        verify = self.curve.estimate(k + 1)
        if verify is None or (k > 0 and self.draft_step_s is None):
            return None
        cost = verify + (k * self.draft_step_s if k else 0.0)
        return expected_tokens(self.alpha, k) / cost if cost > 0 else None

    def note(self) -> str:
        if not self.plain:
            return ""
        return (
            f"Speculation measured slower than the target alone here (acceptance {self.alpha:.0%}); "
            f"decoding plainly and re-trying every {self.probe_every} tokens."
        )

    def _best(self) -> tuple[int | None, float, float]:
        plain_rate = self.expected_rate(0)
        if plain_rate is None or self.draft_step_s is None:
            return None, 0.0, 0.0
        rates = {k: self.expected_rate(k) or 0.0 for k in range(1, self.speculation.max_k + 1)}
        best_k = max(rates, key=rates.get)
        return best_k, rates[best_k], plain_rate
