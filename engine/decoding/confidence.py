"""Stopping a model draft where its own confidence says the next token would not pay (EAGLE-2's finding).

A draft head's top probability at a step predicts how often the target keeps that step's token: on the
built-in model, greedy, first draft tokens whose top probability was below 0.1 were kept 3 % of the
time, 0.3-0.4: 31 %, 0.8-0.9: 91 %, 0.9 and up: all. So instead of drafting a fixed K, the drafter asks
at each step whether this token still raises the round's expected tokens per second:

    reach_i = prod_{j<=i} a(m_j)         the chance the target keeps tokens 0..i, a = calibrated acceptance
    E_i     = 1 + reach_0 + ... + reach_{i-1}      tokens the round emits without token i
    C_i     = t(i+1) + (i+1) * c                   what it costs so far (i+1 draft steps are spent)
    token i goes into the verify      iff  reach_i * C_i > E_i * (t(i+2) - t(i+1))
    step i+1 is drafted               iff  reach_i * a(m_i) * C_{i+1} > E_{i+1} * (c + t(i+3) - t(i+2))

(the second guesses the next step as confident as this one). a(m) is learned per confidence bin from
the rounds' outcomes, starting at the bin's own confidence.

The decision depends only on the draft distribution's top probability m, known before its token is
drawn, never on the token drawn: the kept tokens are still distributed as the draft says, and the
accept/reject test stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass

BINS = 10


class ConfidenceCalibration:
    """a(m): P(the target keeps a draft token | the draft distribution's top probability was m)."""

    def __init__(self, decay: float = 0.995, prior_weight: float = 2.0):
        self.decay, self.prior_weight = decay, prior_weight
        self.kept = [0.0] * BINS
        self.decided = [0.0] * BINS

    def rate(self, confidence: float) -> float:
        b = _bin(confidence)
        prior = (b + 0.5) / BINS
        return (self.kept[b] + prior * self.prior_weight) / (self.decided[b] + self.prior_weight)

    def observe(self, confidences: list[float], accepted: int) -> None:
        """One round: the top probabilities of the tokens drafted, of which the first `accepted` were kept.
        Tokens after the first rejected one were never decided."""
        if not confidences:
            return
        self.kept = [k * self.decay for k in self.kept]
        self.decided = [d * self.decay for d in self.decided]
        for i, confidence in enumerate(confidences[: accepted + 1]):
            b = _bin(confidence)
            self.decided[b] += 1.0
            self.kept[b] += 1.0 if i < accepted else 0.0


@dataclass
class StopRule:
    """One round's stopping rule: `verify_s[n - 1]` = t(n), `draft_step_s` = c (seconds)."""

    calibration: ConfidenceCalibration
    verify_s: list[float]
    draft_step_s: float

    def __post_init__(self):
        self.reach, self.expected = 1.0, 1.0

    def keep(self, step: int, confidence: float) -> bool:
        """Whether token `step` (0-based), whose draft distribution's top probability is `confidence`,
        goes into the verify; call once per step, in order."""
        rate = self.calibration.rate(confidence)
        reach = self.reach * rate
        spent = self._t(step + 1) + (step + 1) * self.draft_step_s
        if reach * spent <= self.expected * max(0.0, self._t(step + 2) - self._t(step + 1)):
            return False
        self.reach, self.expected, self._rate = reach, self.expected + reach, rate
        return True

    def go_on(self, step: int) -> bool:
        """After token `step` was kept: whether drafting token step + 1 is likely to pay."""
        spent = self._t(step + 2) + (step + 2) * self.draft_step_s
        extra = self.draft_step_s + max(0.0, self._t(step + 3) - self._t(step + 2))
        return self.reach * self._rate * spent > self.expected * extra

    def _t(self, n: int) -> float:
        return self.verify_s[min(n, len(self.verify_s)) - 1]


def _bin(confidence: float) -> int:
    return min(BINS - 1, max(0, int(confidence * BINS)))
