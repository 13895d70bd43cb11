"""t_verify(n): what one target forward over n new tokens costs on this device, measured.

It is not flat (on a CPU in eager mode a forward over 5 new tokens costs about 2.4 single steps) and
not always monotone, so adaptive K (engine.decoding.adaptive) works from this measured curve.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from statistics import median

# Before two sizes are measured, assume each extra token verified adds this fraction of a single step.
PRIOR_COST_PER_EXTRA_TOKEN = 0.35


class VerifyCostCurve:
    """t(n): seconds for one target forward over n new tokens (warm cache), the median of the latest
    WINDOW figures per n (the calibrated figure counts as the first of them).

    Sizes never measured are interpolated linearly between measured neighbours, or extrapolated from
    the two largest. `measure` fills it directly; a compiled runner can call it again after compiling.

    On many machines t(n) is not monotone (a kernel that suits 8 rows better than 6). Where a larger
    measured size is cheaper, the loop pads the verify forward up to it (`padded_size`), and
    `estimate` prices n at that size, so the price is what the loop really pays.

    Every observation moves its own size's figure, by a median: a forward timed while another
    program took the core once (3x its figure) moves nothing, where a running average held it dear
    for many rounds, and a size priced dear is rarely chosen, so rarely timed again. Re-calibration of the whole curve is judged from
    single steps alone (the target alone's own forward, and the most frequent one): when they stay off
    their reference by more than DRIFT_LIMIT (another program started, thermal throttling, a longer
    context), every other size is rescaled by the measured ratio too. A larger size that measures off
    on its own says its figure was wrong, not the machine: rescaling t(1) with it would make plain
    decoding look slower than it is, and drafting that loses look like a gain.
    """

    DRIFT_LIMIT = 1.25
    DRIFT_ROUNDS = 8  # observations before a drift is trusted
    PAD_GAIN = 0.95  # pad only to a size measured at least 5 % cheaper
    WINDOW = 7  # figures per size whose median is its price

    def __init__(self, decay: float = 0.8):
        self.decay = decay
        self.seconds: dict[int, float] = {}
        # token-tree verifies, by size: their own path (a tree mask, a graph of its own; an uncompiled
        # forward where the runner has no tree graph) can cost more than a chain of the same size, so
        # they are priced apart
        self.tree_seconds: dict[int, float] = {}
        self.recalibrations = 0
        self._samples: dict[int, deque[float]] = {}  # the latest figures per chain size
        # what drift is judged against: the first single-step figure, rescaled at each re-calibration
        self._reference: dict[int, float] = {}
        self._drift, self._drift_rounds = 1.0, 0

    # Each chain round takes this share of the excess a tree size's figure has over the chain's: a
    # figure timed once under load would otherwise keep every tree out for good, as nothing re-times
    # a size that is never granted. A tree that really costs more is re-timed and kept out again.
    TREE_EXCESS_FADE = 0.02

    def observe(self, n: int, seconds: float) -> None:
        self._fade_tree_excess()
        old = self.seconds.get(n)
        samples = self._samples.get(n)
        if samples is None:
            samples = self._samples[n] = deque([] if old is None else [old], maxlen=self.WINDOW)
        samples.append(seconds)
        self.seconds[n] = median(samples)
        if old is None or n != 1:
            return
        reference = self._reference.setdefault(1, old)
        self._drift = 0.8 * self._drift + 0.2 * (seconds / reference)
        self._drift_rounds += 1
        drifted = self._drift > self.DRIFT_LIMIT or self._drift < 1 / self.DRIFT_LIMIT
        if drifted and self._drift_rounds >= self.DRIFT_ROUNDS:
            self._reference[1] = reference * self._drift
            for m in self.seconds:
                if m != 1:
                    self.seconds[m] *= self._drift
                    if m in self._samples:
                        self._samples[m] = deque(
                            (t * self._drift for t in self._samples[m]), maxlen=self.WINDOW
                        )
            self.recalibrations += 1
            self._drift, self._drift_rounds = 1.0, 0

    def observe_tree(self, n: int, seconds: float) -> None:
        self._average_into(self.tree_seconds, n, seconds)

    def _fade_tree_excess(self) -> None:
        for m, seconds in self.tree_seconds.items():
            chain = self._bounded(m)
            if chain is not None and seconds > chain:
                self.tree_seconds[m] = seconds - self.TREE_EXCESS_FADE * (seconds - chain)

    def _average_into(self, table: dict[int, float], n: int, seconds: float) -> float | None:
        """Moves table[n] towards `seconds` (the running average); returns its figure before."""
        old = table.get(n)
        table[n] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds
        return old

    def replace(self, seconds: dict[int, float]) -> None:
        """A new measured curve (the runner changed, say from eager to compiled): its figures, and
        drift judged from them."""
        self.seconds = dict(seconds)
        self.tree_seconds, self._samples = {}, {}
        self._reference = {}
        self._drift, self._drift_rounds = 1.0, 0

    def padded_size(self, n: int, limit: int | None = None) -> int:
        """The size to run a verify of n tokens at: n, or a larger measured size (at most `limit`)
        that costs less."""
        raw = self._bounded(n)
        if raw is None:
            return n
        larger = [m for m in self.seconds if m > n and (limit is None or m <= limit)]
        cheaper = [m for m in larger if self.seconds[m] < self.PAD_GAIN * raw]
        return min(cheaper, key=lambda m: (self.seconds[m], m)) if cheaper else n

    def widest_at_cost(self, n: int, limit: int, slack: float = 0.03) -> int:
        """How wide a token tree could grow for free: the largest size m up to `limit` such that a
        tree of every size from n + 1 to m costs at most (1 + slack) times the cheapest way to verify n
        tokens (every size up to m: a tree with room for m may hold fewer nodes). ChatEngine builds the
        token-tree graph only where this gives a one-token draft room; each round's tree is then sized
        by what its side nodes are expected to save (Pricer.tree_size)."""
        price = self.estimate(n)
        if price is None:
            return n
        widest = n
        for m in sorted(set(self.seconds) | set(self.tree_seconds)):  # measured sizes only
            if m <= n:
                continue
            if m > limit or self.tree_price(m) > (1 + slack) * price:
                break
            widest = m
        return widest

    def tree_price(self, m: int) -> float:
        """A tree verify of m nodes: its own timing, else the chain's figure times the dearest ratio a
        timed tree size showed. (Where a tree runs the uncompiled forward, 1.5 chains on a compiled
        CPU runner without a tree graph, every size not yet timed as a tree, priced at the chain's
        figure, cost one losing round to find out.)"""
        if m in self.tree_seconds:
            return self.tree_seconds[m]
        chain = self.seconds[m] if m in self.seconds else self._bounded(m)
        if chain is None:
            return float("inf")
        ratios = [
            seconds / self.seconds[s] for s, seconds in self.tree_seconds.items() if self.seconds.get(s)
        ]
        return chain * max([1.0, *ratios])

    def estimate(self, n: int) -> float | None:
        """t(n), kept physically sane so that one noisy measurement cannot mislead adaptive K: never
        below one single step nor above n of them, and priced at the padded size where that is cheaper."""
        raw = self._bounded(n)
        if raw is None:
            return None
        padded = self.padded_size(n)
        return raw if padded == n else self.seconds[padded]

    def _bounded(self, n: int) -> float | None:
        estimate = self._interpolate(n)
        single = self.seconds.get(1)
        if estimate is not None and single is not None:
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

    def to_dict(self) -> dict[int, float]:
        return dict(sorted(self.seconds.items()))


def prior_shape(n: int) -> float:
    """Cost of a forward over n tokens in single steps, before measurements say otherwise."""
    return 1.0 + PRIOR_COST_PER_EXTRA_TOKEN * (n - 1)
