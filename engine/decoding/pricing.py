"""What a drafter's rounds are worth, in expected tokens per second: the best K, the size of a token
tree, the rate of a given K. Pure: a `Pricer` reads the figures it is handed and changes nothing, so
adaptive K (engine.decoding.adaptive) and the planner can ask it as often as they like.

A round that drafts K tokens emits on average E(K) tokens (accepted drafts + one target token),
from the drafter's measured per-position acceptance (engine.decoding.acceptance), and costs
K * t_draft + t_verify(K+1) + o_round: K draft steps, then one target forward over the last token and
the K drafts, then what else the loop spends on a drafted round. Plain decoding emits 1 token per
t_verify(1) + o_plain. t_verify(n) is a measured curve (engine.decoding.verify_cost); the overheads
are what whole rounds of each kind measured beyond their draft and verify (engine.decoding.pace).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.decoding.acceptance import AcceptanceModel, expected_tokens_from
from engine.decoding.verify_cost import VerifyCostCurve

MAX_TREE_SIZE = 32  # tokens in one tree verify forward, however flat the cost curve
# a side node must be expected to pay at least this share more than it costs: a tree's price and a
# chain's are timed apart, in different rounds, and on a CPU each is a few per cent off
TREE_MARGIN = 0.03


@dataclass(frozen=True)
class Pricer:
    acceptance: AcceptanceModel
    curve: VerifyCostCurve
    draft_step_s: float | None  # None before a draft step was measured
    # the (decayed) share of drafting rounds that stopped before the first token (a confidence stop):
    # each a plain step plus one draft step
    empty_share: float = 0.0
    # K is chosen from an upper confidence bound on acceptance (AcceptanceModel.conditional): what is
    # measured often is judged by its figure, what is measured rarely gets the benefit of the doubt
    optimism: float = 0.0
    # tokens per second the drafter's rounds really gave, where its price is capped by that (a drafter
    # that stops by its confidence drafts fewer tokens than it is priced for); None: no cap
    yield_cap: float | None = None
    # how often a token tree's side node is kept where the main branch was rejected beside it
    side_acceptance: float = 0.0
    # seconds a plain step and a drafted round spend outside their verify and draft (PaceLedger)
    plain_overhead_s: float = 0.0
    round_overhead_s: float = 0.0

    def expected_rate(self, k: int, condition=None, optimism: float = 0.0) -> float | None:
        """Tokens per second expected with K = k (under `condition`, for a lookup drafter); with
        optimism > 0, from the acceptance's upper confidence bound (AcceptanceModel.conditional)."""
        verify = self.curve.estimate(k + 1)
        if verify is None or (k > 0 and self.draft_step_s is None):
            return None
        cost = verify + (k * self.draft_step_s + self.round_overhead_s if k else self.plain_overhead_s)
        return self.acceptance.expected_tokens(k, condition, optimism) / cost if cost > 0 else None

    def best(self, cap: int, condition=None, step_s: float | None = None) -> tuple[int | None, float, float]:
        """(best K in 1..cap, its expected tokens/s, a plain step's tokens/s); K None before measurements.
        `step_s`: price at this draft step instead of the measured one (and without the yield cap)."""
        plain_rate = self.expected_rate(0)
        step = self.draft_step_s if step_s is None else step_s
        if plain_rate is None or step is None or cap <= 0:
            return None, 0.0, plain_rate or 0.0
        conditional = self.acceptance.conditional(condition, self.optimism)
        best_k, best_rate, tokens, survive = None, 0.0, 1.0, 1.0
        overhead = self.round_overhead_s
        empty, empty_cost = self.empty_share, self.curve.estimate(1) + step + overhead
        for k in range(1, cap + 1):  # E(k) built up position by position
            survive *= conditional[k - 1] if k - 1 < len(conditional) else 0.0
            tokens += survive
            cost = self.curve.estimate(k + 1) + k * step + overhead
            rate = ((1 - empty) * tokens + empty) / ((1 - empty) * cost + empty * empty_cost)
            if best_k is None or rate > best_rate:
                best_k, best_rate = k, rate
        if self.yield_cap is not None and step_s is None:
            best_rate = min(best_rate, self.yield_cap)
        return best_k, best_rate, plain_rate

    def could_win(self, cap: int, plain_rate: float, step_s: float, margin: float) -> bool:
        """Whether some K in 1..cap would beat `plain_rate` by `margin` if the target accepted every
        draft token, at a draft step of `step_s`."""
        for k in range(1, cap + 1):
            cost = self.curve.estimate(k + 1) + k * step_s + self.round_overhead_s
            if (k + 1) / cost > plain_rate * (1 + margin):
                return True
        return False

    def tree_size(self, k: int, condition=None, limit: int = MAX_TREE_SIZE) -> int:
        """Nodes to verify (the root included) in a round that drafts k tokens: k + 1, a chain, or a
        tree with one side node beside each of the first draft tokens, shallowest first, as many as
        pay for their verify. A side node at depth d saves the round where the chain survives to d and
        fails there, with probability reach_d (1 - p_d), and is right then with side_acceptance: one
        token more. Each size is priced at what a tree of that size measured (VerifyCostCurve.tree_price)."""
        chain = self.curve.estimate(k + 1)
        if chain is None or k <= 0:
            return k + 1
        conditional, side = self.acceptance.conditional(condition), self.side_acceptance
        draft = k * (self.draft_step_s or 0.0) + self.round_overhead_s
        tokens, reach = expected_tokens_from(conditional, k), 1.0
        best_size, best_rate = k + 1, tokens / (draft + chain)
        for depth in range(min(k, limit - k - 1)):
            p = conditional[depth] if depth < len(conditional) else 0.0
            tokens += reach * (1 - p) * side
            reach *= p
            size = k + 2 + depth
            rate = tokens / (draft + self.curve.tree_price(size))
            if rate > best_rate * (1 + TREE_MARGIN):
                best_size, best_rate = size, rate
        return best_size
