"""Choosing K, the number of draft tokens per round, for one drafter, from what this device measures
(engine.decoding.planner compares the drafters' prices to choose among them).

A round that drafts K tokens emits on average E(K) tokens (accepted drafts + one target token),
from the drafter's measured per-position acceptance (engine.decoding.acceptance), and costs
K * t_draft + t_verify(K+1): K draft steps, then one target forward over the last token and the K
drafts. Plain decoding emits 1 token per t_verify(1). We pick the K in 0..max_k with the best
tokens per second, or no draft. t_verify(n) is a measured curve (engine.decoding.verify_cost).
A drafter that stops by its own confidence is priced at no more than its rounds really gave.
"""

from __future__ import annotations

from engine.decoding.acceptance import AcceptanceModel, expected_tokens_from
from engine.decoding.confidence import ConfidenceCalibration, StopRule
from engine.decoding.drafters.base import Drafter, Lookahead, StopsByConfidence, capability
from engine.decoding.verify_cost import VerifyCostCurve
from engine.settings import SpeculationSettings

MAX_TREE_SIZE = 32  # tokens in one tree verify forward, however flat the cost curve


def expected_tokens(alpha: float, k: int) -> float:
    """The geometric model, E(K) = 1 + a + ... + a^K, for a constant per-token acceptance a."""
    if alpha >= 1.0 - 1e-9:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class KController:
    """K for one drafter: fixed, or the K in 0..max_k with the best expected tokens per second,
    from the drafter's measured per-position acceptance (engine.decoding.acceptance) and the
    measured verify-cost curve. A round expected to lose against a plain step is not drafted.

    While drafting loses, one round in `probe_every` is drafted anyway (at least PROBE_K tokens, so
    later positions get measured too) and the estimates can recover. A probe that beat a plain step
    halves the interval; one that lost (kept nothing, or too little to pay for its draft and verify)
    doubles it (up to MAX_PROBE_INTERVAL), so a drafter that never helps costs almost nothing, and
    one whose probes win and lose by turns keeps probing at about the same pace.
    """

    PROBE_K = 2  # the first probe of a drafter nothing is known about
    PROBE_COST = 1.25  # a probe's verify forward costs at most this many single steps (but K = 1 always may)
    # At the start of a reply the earlier replies' counts keep this weight: how well a draft does
    # depends on the prompt (a head right 30 % of the time in English is right 5 % in German), so a
    # reply's own first rounds must be able to outweigh them.
    REPLY_MEMORY = 0.3
    MAX_PROBE_INTERVAL = 1024
    # K is chosen from an upper confidence bound on acceptance (z in AcceptanceModel.conditional):
    # what is measured often is judged by its figure, what is measured rarely gets the benefit of the doubt.
    # Not for a drafter that stops by its own confidence (`for_drafter`): each round's tokens are already
    # chosen one by one from its calibrated confidence, so the bound only kept it drafting where it lost
    # (a draft head at a fifth of a 4-bit target's step: 0.96x the target alone with the bound, 0.99x
    # without; each reply's first rounds drafted at a loss while few rounds stood behind its figure).
    OPTIMISM = 1.0
    # A token tree's side node (the head's second choice, another match's continuation) kept where the
    # main branch was rejected beside it, before that is measured: teacher-forced on Tandem's prompts,
    # the shipped head's second choice was right at about one in five of the places its first was not.
    SIDE_PRIOR, SIDE_PRIOR_WEIGHT = 0.2, 2.0
    # a side node must be expected to pay at least this share more than it costs: a tree's price and a
    # chain's are timed apart, in different rounds, and on a CPU each is a few per cent off
    TREE_MARGIN = 0.03
    # After STRETCH_AFTER rounds in a row kept every token they drafted, a round drafts one token past
    # the chosen K where fewer than THIN_EVIDENCE (decayed) rounds stand behind that position's estimate.
    # Rounds that keep all K tokens never decide position K: one early rejection there would otherwise
    # hold K below it for as long as the decay takes to forget that round.
    STRETCH_AFTER, THIN_EVIDENCE = 2, 1.5
    # A drafter that stops by its confidence drafts fewer tokens than the K it is priced at, so its
    # price is capped by what its rounds really gave (tokens per second, decayed), once this many
    # rounds stand behind that: priced for K tokens, the shipped head was worth 73-98 tok/s to `auto`
    # where its rounds of one to three tokens gave about 65, and it drafted in place of the copy.
    YIELD_ROUNDS = 3.0
    # A drafter `auto` has not chosen for STALE_AFTER rounds, or whose draft step was recalled from an
    # earlier start, is priced from a draft step measured then, perhaps while the machine was busy.
    # Never chosen again, it was never measured again: a copy timed at 15 ms a step while a graph built
    # in the background (6.4 ms at best) lost every round to the draft head, start after start. Such a
    # drafter gets one round when only its draft step keeps it from beating the chosen one (it would
    # win if drafting cost nothing), and that round's step replaces the stale figure. One that still
    # loses waits twice as long for the next such round (up to MAX_PROBE_INTERVAL).
    STALE_AFTER = 32

    def __init__(
        self,
        speculation: SpeculationSettings,
        curve: VerifyCostCurve,
        probe_every: int = 32,
        acceptance: AcceptanceModel | None = None,
        margin: float = 0.02,
        optimism: float = OPTIMISM,
    ):
        self.speculation, self.curve = speculation, curve
        self.probe_every, self.margin = probe_every, margin
        self.optimism = optimism
        self.acceptance = acceptance or AcceptanceModel()
        self.draft_step_s: float | None = None
        self.plain = False  # the last choice: speculation expected slower than the target alone
        # for a drafter that stops by its own confidence: what each confidence is worth, and the
        # (decayed) share of drafting rounds it stopped before the first token, each a plain step plus
        # one draft step
        self.calibration = ConfidenceCalibration()
        self.empty_share = 0.0
        self._probe_interval, self._since_probe, self._probing = probe_every, 0, False
        self.fastest_draft_step_s, self.draft_steps_seen = float("inf"), 0
        self._side_won = self._side_chances = 0.0  # decayed: side nodes kept, and rounds that had the chance
        self._kept_all_streak = 0  # rounds in a row that kept every token they drafted
        self.caps_by_yield = False  # price capped by its rounds' real yield (for_drafter: confidence stops)
        self._yield_tokens = self._yield_s = self._yield_rounds = 0.0  # decayed, over its drafting rounds
        self._idle_rounds = 0  # rounds `auto` gave another drafter since this one last drafted
        self._stale_after, self._refreshing = self.STALE_AFTER, False

    @classmethod
    def for_drafter(
        cls, drafter: Drafter, speculation: SpeculationSettings, curve: VerifyCostCurve, **kwargs
    ):
        stops_by_confidence = capability(drafter, StopsByConfidence) is not None
        controller = cls(speculation, curve, optimism=0.0 if stops_by_confidence else cls.OPTIMISM, **kwargs)
        controller.caps_by_yield = stops_by_confidence
        return controller

    @property
    def alpha(self) -> float:
        """Acceptance of the first draft token, over every condition (what the stats show)."""
        return self.acceptance.first_position_rate

    def choose(self, limit: int, hint: Lookahead | None = None) -> int:
        """K for the next round, at most `limit` (tokens left); 0 means a plain step."""
        hint = hint or Lookahead()
        cap = limit if hint.available is None else min(limit, hint.available)
        if not self.speculation.adaptive:
            return max(0, min(self.speculation.k, cap))
        cap = min(cap, self.speculation.max_k)
        if cap <= 0:
            return 0
        best_k, best_rate, plain_rate = self.best(cap, hint.condition)
        if best_k is None:  # nothing measured yet: a first probe
            return min(self.PROBE_K, cap)
        self.plain = best_rate <= plain_rate * (1 + self.margin)
        if not self.plain:
            return self.stretch(best_k, cap)
        if not self.could_win(cap, plain_rate):  # a probe can only lose: once in MAX_PROBE_INTERVAL rounds
            self._probe_interval = self.MAX_PROBE_INTERVAL
        return self.probe_k(best_k, cap) if self.due_probe() else 0

    def could_win(self, cap: int, plain_rate: float) -> bool:
        """Whether some K would beat a plain step if the target accepted every draft token, at the
        fastest draft step measured (one slow step, such as a GPU graph's first capture, must not
        condemn a drafter). A draft whose step costs about a target step never can (the target
        drafting for itself on a GPU, where verifying 5 tokens costs 1.07 steps)."""
        if self.draft_steps_seen < 2:
            return True
        for k in range(1, cap + 1):
            cost = self.curve.estimate(k + 1) + k * self.fastest_draft_step_s
            if (k + 1) / cost > plain_rate * (1 + self.margin):
                return True
        return False

    def best(self, cap: int, condition=None, step_s: float | None = None) -> tuple[int | None, float, float]:
        """(best K in 1..cap, its expected tokens/s, a plain step's tokens/s); K None before measurements.
        `step_s`: price at this draft step instead of the measured one (and without the yield cap)."""
        plain_rate = self.expected_rate(0)
        step = self.draft_step_s if step_s is None else step_s
        if plain_rate is None or step is None or cap <= 0:
            return None, 0.0, plain_rate or 0.0
        conditional = self.acceptance.conditional(condition, self.optimism)
        best_k, best_rate, tokens, survive = None, 0.0, 1.0, 1.0
        empty, empty_cost = self.empty_share, self.curve.estimate(1) + step
        for k in range(1, cap + 1):  # E(k) built up position by position
            survive *= conditional[k - 1] if k - 1 < len(conditional) else 0.0
            tokens += survive
            cost = self.curve.estimate(k + 1) + k * step
            rate = ((1 - empty) * tokens + empty) / ((1 - empty) * cost + empty * empty_cost)
            if best_k is None or rate > best_rate:
                best_k, best_rate = k, rate
        measured = self.measured_rate()
        if self.caps_by_yield and measured is not None and step_s is None:
            best_rate = min(best_rate, measured)
        return best_k, best_rate, plain_rate

    def sit_out(self) -> None:
        """`auto` gave this round to another drafter (or to none)."""
        self._idle_rounds += 1

    def recalled_draft_step(self) -> None:
        """draft_step_s comes from an earlier start (engine.decoding.drafter_memory): stale until measured."""
        self._stale_after = self.STALE_AFTER
        self._idle_rounds = max(self._idle_rounds, self.STALE_AFTER)

    def refresh_k(self, cap: int, condition, rate_to_beat: float) -> int | None:
        """K for a round that measures a stale draft step again (see STALE_AFTER), when this drafter
        would beat `rate_to_beat` if drafting cost nothing; None otherwise."""
        if self._idle_rounds < self._stale_after or self.draft_step_s is None:
            return None
        k, rate, _ = self.best(cap, condition, step_s=0.0)
        if k is None or rate <= rate_to_beat:
            return None
        self._refreshing = True
        self._stale_after = min(2 * self._stale_after, self.MAX_PROBE_INTERVAL)
        return k

    def measured_rate(self) -> float | None:
        """Tokens per second this drafter's rounds really gave (decayed); None before YIELD_ROUNDS."""
        if self._yield_rounds < self.YIELD_ROUNDS or self._yield_s <= 0:
            return None
        return self._yield_tokens / self._yield_s

    @property
    def side_acceptance(self) -> float:
        """How often a side node is kept where the main branch was rejected beside it."""
        prior = self.SIDE_PRIOR * self.SIDE_PRIOR_WEIGHT
        return (self._side_won + prior) / (self._side_chances + self.SIDE_PRIOR_WEIGHT)

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
        draft = k * (self.draft_step_s or 0.0)
        tokens, reach = expected_tokens_from(conditional, k), 1.0
        best_size, best_rate = k + 1, tokens / (draft + chain)
        for depth in range(min(k, limit - k - 1)):
            p = conditional[depth] if depth < len(conditional) else 0.0
            tokens += reach * (1 - p) * side
            reach *= p
            size = k + 2 + depth
            rate = tokens / (draft + self.curve.tree_price(size))
            if rate > best_rate * (1 + self.TREE_MARGIN):
                best_size, best_rate = size, rate
        return best_size

    def stop_rule(self, k: int) -> StopRule | None:
        """The confidence stop for a round of at most k draft tokens; None before anything is measured."""
        costs = [self.curve.estimate(n) for n in range(1, k + 3)]
        if self.draft_step_s is None or any(cost is None for cost in costs):
            return None
        return StopRule(self.calibration, costs, self.draft_step_s)

    def start_reply(self) -> None:
        if not self.speculation.adaptive:
            return
        self.acceptance.start_reply(self.REPLY_MEMORY)
        self._probe_interval = min(self._probe_interval, self.probe_every)

    def due_probe(self) -> bool:
        """Counts one round this drafter sat out while losing; True when it should probe."""
        self._since_probe += 1
        if self._since_probe < self._probe_interval:
            return False
        self._since_probe, self._probing = 0, True
        return True

    def stretch(self, k: int, cap: int) -> int:
        """k, or k + 1 where the rounds kept everything lately and position k is barely measured."""
        if self._kept_all_streak < self.STRETCH_AFTER or k >= cap:
            return k
        if self.acceptance.decided(k) >= self.THIN_EVIDENCE:
            return k
        self._kept_all_streak = 0
        return k + 1

    def probe_k(self, best_k: int, cap: int) -> int:
        """One position past the best K, so the next position gets measured too, but no longer than
        a verify that costs at most PROBE_COST single steps: on a CPU, where t(4) can be 1.5 t(1),
        a probe that loses must cost little more than a plain step."""
        k = max(1, min(best_k + 1, cap))
        single = self.curve.estimate(1)
        while k > 1 and single and self.curve.estimate(k + 1) > self.PROBE_COST * single:
            k -= 1
        return k

    def observe(
        self,
        k: int,
        drafted: int,
        accepted: int,
        draft_s: float,
        verify_s: float,
        condition=None,
        verify_size: int | None = None,
        tree: bool = False,
        side_chance: bool = False,
        side_won: bool = False,
    ) -> None:
        """One round: `drafted` tokens proposed (<= k), `accepted` kept; times in seconds;
        `verify_size`: tokens the verify forward really ran (drafted + 1 unless padded);
        `tree`: the verify was a token tree (its time goes to the tree prices, not the chain curve);
        `side_chance`, `side_won`: a side node stood where the chain was rejected, and was kept."""
        if tree:
            self.curve.observe_tree(verify_size or drafted + 1, verify_s)
            if side_chance:  # remembered as long as the acceptance counts are
                decay = self.acceptance.decay
                self._side_won = decay * self._side_won + side_won
                self._side_chances = decay * self._side_chances + 1.0
        else:
            self.curve.observe(verify_size or drafted + 1, verify_s)
        if k > 0:
            self.empty_share = 0.95 * self.empty_share + (0.05 if drafted == 0 else 0.0)
            decay = self.acceptance.decay
            self._yield_tokens = decay * self._yield_tokens + accepted + 1 + side_won
            self._yield_s = decay * self._yield_s + draft_s + verify_s
            self._yield_rounds = decay * self._yield_rounds + 1.0
        if self._probing:
            # lost: it gave fewer tokens per second than a plain step would have. One that drafted
            # nothing (a confidence stop) lost too, having paid a draft step, and one kept token need
            # not pay for a draft step and a dearer verify.
            single = self.curve.estimate(1)
            lost = accepted == 0 or (single is not None and (accepted + 1) * single < draft_s + verify_s)
            grown, shrunk = 2 * self._probe_interval, max(1, self._probe_interval // 2)
            self._probe_interval = min(grown, self.MAX_PROBE_INTERVAL) if lost else shrunk
            self._probing = False
        if drafted == 0:
            return
        self._kept_all_streak = self._kept_all_streak + 1 if accepted >= drafted else 0
        self.acceptance.observe(drafted, accepted, condition)
        step = draft_s / drafted
        stale = self._idle_rounds >= self.STALE_AFTER
        self.draft_step_s = (
            step if self.draft_step_s is None or stale else 0.8 * self.draft_step_s + 0.2 * step
        )
        if not self._refreshing:  # chosen on its price: a later stale step is measured again soon
            self._stale_after = self.STALE_AFTER
        self._idle_rounds, self._refreshing = 0, False
        self.fastest_draft_step_s = min(self.fastest_draft_step_s, step)
        self.draft_steps_seen += 1

    def expected_rate(self, k: int, condition=None, optimism: float = 0.0) -> float | None:
        """Tokens per second expected with K = k (under `condition`, for a lookup drafter); with
        optimism > 0, from the acceptance's upper confidence bound (AcceptanceModel.conditional)."""
        verify = self.curve.estimate(k + 1)
        if verify is None or (k > 0 and self.draft_step_s is None):
            return None
        cost = verify + (k * self.draft_step_s if k else 0.0)
        return self.acceptance.expected_tokens(k, condition, optimism) / cost if cost > 0 else None

    def note(self) -> str:
        if not self.plain:
            return ""
        return (
            f"Speculation measured slower than the target alone here (acceptance {self.alpha:.0%}); "
            f"decoding plainly and re-trying every {self._probe_interval} rounds."
        )
