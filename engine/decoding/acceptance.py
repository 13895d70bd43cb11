"""What a drafter's round really yields: per-position conditional acceptance, measured.

A round that drafts K tokens emits the accepted prefix plus the target's own token, so
    E(K) = 1 + sum_{j=1..K} prod_{i<j} p_i,      p_i = P(draft token i accepted | tokens 0..i-1 accepted).
A single rate a (p_i = a for every i) is the geometric model, and it does not fit lookup drafters:
their acceptance is bimodal (a match is right for many tokens or wrong at the first one), so p_0 is
low and p_1, p_2, ... are high. Measuring each p_i separately fits both shapes.

A lookup drafter also says how long its match is before it drafts (`Drafter.peek`); acceptance is
kept per match length too ("condition"), shrunk towards the drafter's overall figures while a
condition has few observations:
    p_i(all)  = (accepted_i + prior_i * w) / (decided_i + w),   prior_0 = PRIOR_ACCEPTANCE (from a
                                                   reply's start: p_0 as it was measured before it),
                                                   prior_i = max(PRIOR_AFTER_ACCEPT, p_{i-1}(all))
    p_i(c)    = (accepted_i(c) + p_i(all) * w) / (decided_i(c) + w)
Counts decay, so the model follows a drafter whose acceptance changes within a reply. The prior
of a later position is at least the estimate of the one before: once a draft token is accepted,
the next one is rarely less likely to be (equal for the geometric shape, higher for the bimodal
one), and an optimistic figure for positions never drafted is what lets K grow to measure them.
"""

from __future__ import annotations

from collections.abc import Hashable

from engine.settings import MAX_K

PRIOR_ACCEPTANCE = 0.5  # before anything is measured: a coin flip for the first draft token
PRIOR_AFTER_ACCEPT = 0.8  # and a likely acceptance for the next ones once one was accepted
PRIOR_WEIGHT = 1.0  # worth one observation
# at most this many distinct conditions are kept per drafter (match lengths are bucketed, so few)
MAX_CONDITIONS = 32
# A reply whose first draft tokens are kept far more or less often than the earlier replies said
# (a binomial tail below CHANGE_P_VALUE after at least CHANGE_MIN_ROUNDS rounds) drops their counts.
CHANGE_P_VALUE = 0.05
CHANGE_MIN_ROUNDS = 4
CHANGE_MAX_ROUNDS = 64


class AcceptanceModel:
    def __init__(
        self,
        positions: int = MAX_K,
        prior: float = PRIOR_ACCEPTANCE,
        prior_weight: float = PRIOR_WEIGHT,
        decay: float = 0.97,  # a memory of about 33 rounds: a poor prompt stops drafting within its reply
        prior_after_accept: float = PRIOR_AFTER_ACCEPT,
    ):
        self.positions, self.prior, self.prior_weight, self.decay = positions, prior, prior_weight, decay
        self.prior_after_accept = prior_after_accept
        self._all = _Counts(positions)
        self._by_condition: dict[Hashable, _Counts] = {}
        self._inherited_rate: float | None = None  # p_0 at the start of this reply, while it is trusted
        # p_0 at the start of this reply, the prior its scaled-down counts are shrunk towards
        self._reply_prior: float | None = None
        self._reply_decided = self._reply_accepted = 0
        # this reply contradicted the earlier ones: its own rounds are evidence enough, without optimism
        self.changed_this_reply = False

    def observe(self, drafted: int, accepted: int, condition: Hashable = None) -> None:
        """One round: `drafted` tokens proposed, the first `accepted` kept. Positions after the first
        rejection were never decided and are not counted."""
        if drafted <= 0:
            return
        self._all.add(drafted, accepted, self.decay)
        self._test_the_inherited_counts(drafted, accepted)
        if condition is not None:
            counts = self._by_condition.get(condition)
            if counts is None:
                if len(self._by_condition) >= MAX_CONDITIONS:
                    self._by_condition.pop(next(iter(self._by_condition)))
                counts = self._by_condition[condition] = _Counts(self.positions)
            counts.add(drafted, accepted, self.decay)

    def start_reply(self, keep: float) -> None:
        """A new reply: the counts so far keep weight `keep`, and become what this reply is tested
        against. Once this reply's first positions contradict them (a binomial tail below
        CHANGE_P_VALUE, either way), they are dropped and the reply's own rounds decide alone.

        The first position's scaled-down counts are shrunk towards the estimate they gave, not
        towards the uninformed prior: the reply starts from what was measured, held more loosely.
        Towards the prior, a drafter measured right 44 % of the time looked like a coin flip again
        at every reply's start, and `auto` gave it the first rounds of each reply in place of a copy
        kept 96 % of the time. Later positions keep their optimistic prior, which lets K grow."""
        self._inherited_rate = self._reply_prior = self.conditional()[0]
        for counts in self._counts():
            counts.scale(keep)
            counts.mark_inherited()
        self._reply_decided = self._reply_accepted = 0
        self.changed_this_reply = False

    def _counts(self) -> list[_Counts]:
        return [self._all, *self._by_condition.values()]

    def _test_the_inherited_counts(self, drafted: int, accepted: int) -> None:
        if self._inherited_rate is None:
            return
        self._reply_decided += 1
        self._reply_accepted += accepted > 0
        n, hits, rate = self._reply_decided, self._reply_accepted, self._inherited_rate
        if n > CHANGE_MAX_ROUNDS:  # by now the decay has all but replaced the earlier replies' counts
            self._inherited_rate = None
            return
        if n < CHANGE_MIN_ROUNDS:
            return
        if binomial_tail(hits, n, rate) < CHANGE_P_VALUE:
            for counts in self._counts():
                counts.drop_inherited()
            self._inherited_rate = self._reply_prior = None
            self.changed_this_reply = True

    def conditional(self, condition: Hashable = None, optimism: float = 0.0) -> list[float]:
        """[p_0, p_1, ...]: acceptance at each position given every earlier one was accepted.

        optimism z > 0 raises p_0 to an upper confidence bound, p + z * sqrt(p (1 - p) / (n + 1)) with
        n the drafter's (decayed) rounds: a drafter measured a few times gets tried a few more times
        before one unlucky round can write it off. n counts all of its rounds, not only those under
        `condition`: a lookup's match lengths are many, and with a bound per match length each new
        one looked nearly sure (p_0 0.46 raised to 0.96), so `auto` let fresh matches draft in place
        of a quantized copy whose drafts were kept 96 % of the time, and lost those rounds. (Later
        positions already start from an optimistic prior, PRIOR_AFTER_ACCEPT.) Not in a reply that
        has contradicted the earlier ones: its rounds agreed with each other well enough to overrule
        them, and optimism would keep a poor draft going for rounds more."""
        estimates = [p for p, _ in self._estimates(condition)]
        if optimism > 0 and not self.changed_this_reply:
            p, n = estimates[0], self.observations()
            estimates[0] = min(1.0, p + optimism * (p * (1 - p) / (n + 1)) ** 0.5)
        return estimates

    def _estimates(self, condition: Hashable) -> list[tuple[float, float]]:
        """(p_i, decided_i) per position, shrunk as the module docstring says."""
        pooled, prior = [], self.prior if self._reply_prior is None else self._reply_prior
        for accepted, decided in zip(self._all.accepted, self._all.decided, strict=True):
            estimate = (accepted + prior * self.prior_weight) / (decided + self.prior_weight)
            pooled.append(estimate)
            prior = max(self.prior_after_accept, estimate)
        counts = self._by_condition.get(condition) if condition is not None else None
        if counts is None:
            return list(zip(pooled, self._all.decided, strict=True))
        return [
            ((a + p * self.prior_weight) / (d + self.prior_weight), d)
            for a, d, p in zip(counts.accepted, counts.decided, pooled, strict=True)
        ]

    def expected_tokens(self, k: int, condition: Hashable = None, optimism: float = 0.0) -> float:
        """E(K): tokens a round drafting k emits on average (accepted drafts + the target's token)."""
        return expected_tokens_from(self.conditional(condition, optimism), k)

    def observations(self, condition: Hashable = None) -> float:
        """Decayed number of rounds behind the estimate for `condition` (all rounds for None)."""
        counts = self._all if condition is None else self._by_condition.get(condition)
        return counts.decided[0] if counts is not None else 0.0

    def decided(self, position: int) -> float:
        """Decayed number of rounds that decided draft position `position` (0-based), over every condition."""
        return self._all.decided[position] if position < self.positions else 0.0

    def counts(self) -> dict[str, list[float]]:
        """The drafter's (decayed) counts per position, over every condition: what a later start
        can begin from (engine.decoding.drafter_memory)."""
        return {"accepted": list(self._all.accepted), "decided": list(self._all.decided)}

    def set_counts(self, accepted: list[float], decided: list[float]) -> None:
        """Begins from counts another start measured; the next reply holds them as loosely as it
        holds any earlier reply's (start_reply)."""
        n = self.positions
        self._all.accepted = [float(a) for a in accepted[:n]] + [0.0] * (n - len(accepted[:n]))
        self._all.decided = [float(d) for d in decided[:n]] + [0.0] * (n - len(decided[:n]))

    @property
    def first_position_rate(self) -> float:
        return self.conditional()[0]


def expected_tokens_from(conditional: list[float], k: int) -> float:
    total, survive = 1.0, 1.0
    for p in conditional[:k]:
        survive *= p
        total += survive
    return total


def binomial_tail(hits: int, n: int, rate: float) -> float:
    """The probability of an outcome at least as far from n * rate as `hits`, on the same side."""
    from math import comb

    def pmf(j: int) -> float:
        return comb(n, j) * rate**j * (1 - rate) ** (n - j)

    if hits <= n * rate:
        return sum(pmf(j) for j in range(hits + 1))
    return sum(pmf(j) for j in range(hits, n + 1))


class _Counts:
    """Decayed accepted / decided counts per draft position, and the part of them from earlier replies."""

    def __init__(self, positions: int):
        self.accepted = [0.0] * positions
        self.decided = [0.0] * positions
        self.inherited_accepted = [0.0] * positions
        self.inherited_decided = [0.0] * positions

    def scale(self, keep: float) -> None:
        self.accepted = [a * keep for a in self.accepted]
        self.decided = [d * keep for d in self.decided]

    def mark_inherited(self) -> None:
        self.inherited_accepted, self.inherited_decided = list(self.accepted), list(self.decided)

    def drop_inherited(self) -> None:
        self.accepted = [max(0.0, a - b) for a, b in zip(self.accepted, self.inherited_accepted, strict=True)]
        self.decided = [max(0.0, d - b) for d, b in zip(self.decided, self.inherited_decided, strict=True)]
        self.inherited_accepted = [0.0] * len(self.accepted)
        self.inherited_decided = [0.0] * len(self.decided)

    def add(self, drafted: int, accepted: int, decay: float) -> None:
        for i in range(len(self.decided)):
            self.accepted[i] *= decay
            self.decided[i] *= decay
            self.inherited_accepted[i] *= decay
            self.inherited_decided[i] *= decay
        for i in range(min(accepted, len(self.decided))):
            self.accepted[i] += 1.0
            self.decided[i] += 1.0
        if accepted < drafted and accepted < len(self.decided):
            self.decided[accepted] += 1.0
