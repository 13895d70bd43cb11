"""Choosing K, the number of draft tokens per round, for one drafter, from what this device measures
(engine.decoding.planner compares the drafters' prices to choose among them).

`KController` holds what is measured of one drafter (acceptance, draft step, side nodes) and chooses
its K from three parts, each owning one job:
  Pricer (engine.decoding.pricing)  pure: the best K, a token tree's size, the rate of a K;
  ProbeSchedule                     when a drafter that loses drafts anyway (a probe), how long a
                                    probe is, and when a stale draft step is timed again;
  YieldTracker                      tokens per second the drafter's rounds really gave.
We pick the K in 0..max_k with the best expected tokens per second, or no draft. A drafter that
stops by its own confidence is priced at no more than its rounds really gave.
"""

from __future__ import annotations

from engine.decoding.acceptance import PRIOR_WEIGHT, AcceptanceModel
from engine.decoding.confidence import ConfidenceCalibration, StopRule
from engine.decoding.drafters.base import Drafter, Lookahead, StopsByConfidence, capability
from engine.decoding.pricing import MAX_TREE_SIZE, Pricer
from engine.decoding.verify_cost import VerifyCostCurve
from engine.settings import SpeculationSettings


def expected_tokens(alpha: float, k: int) -> float:
    """The geometric model, E(K) = 1 + a + ... + a^K, for a constant per-token acceptance a."""
    if alpha >= 1.0 - 1e-9:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class ProbeSchedule:
    """While drafting loses, one round in `interval` is drafted anyway (a probe: at least PROBE_K
    tokens, so later positions get measured too) and the estimates can recover. A probe that beat a
    plain step halves the interval; one that lost (kept nothing, or too little to pay for its draft
    and verify) doubles it (up to MAX_PROBE_INTERVAL), so a drafter that never helps costs almost
    nothing, and one whose probes win and lose by turns keeps probing at about the same pace.

    A drafter `auto` has not chosen for STALE_AFTER rounds, or whose draft step was recalled from an
    earlier start, is priced from a draft step measured then, perhaps while the machine was busy.
    Never chosen again, it was never measured again: a copy timed at 15 ms a step while a graph built
    in the background (6.4 ms at best) lost every round to the draft head, start after start. Such a
    drafter gets one round when only its draft step keeps it from beating the chosen one (it would
    win if drafting cost nothing), and that round's step replaces the stale figure. One that still
    loses waits twice as long for the next such round (up to MAX_PROBE_INTERVAL).
    """

    PROBE_K = 2  # the first probe of a drafter nothing is known about
    PROBE_COST = 1.25  # a probe's verify forward costs at most this many single steps (but K = 1 always may)
    MAX_PROBE_INTERVAL = 1024
    STALE_AFTER = 32

    def __init__(self, curve: VerifyCostCurve, probe_every: int = 32):
        self.curve, self.probe_every = curve, probe_every
        self.interval = probe_every  # rounds between probes now
        self._since_probe, self._probing = 0, False
        self.idle_rounds = 0  # rounds `auto` gave another drafter since this one last drafted
        self._stale_after, self._refreshing = self.STALE_AFTER, False

    def start_reply(self) -> None:
        self.interval = min(self.interval, self.probe_every)

    def hopeless(self) -> None:
        """No K could beat a plain step: a probe can only lose, so one comes once in MAX_PROBE_INTERVAL rounds."""
        self.interval = self.MAX_PROBE_INTERVAL

    def due(self) -> bool:
        """Counts one round this drafter sat out while losing; True when it should probe."""
        self._since_probe += 1
        if self._since_probe < self.interval:
            return False
        self._since_probe, self._probing = 0, True
        return True

    def probe_k(self, best_k: int, cap: int) -> int:
        """One position past the best K, so the next position gets measured too, but no longer than
        a verify that costs at most PROBE_COST single steps: on a CPU, where t(4) can be 1.5 t(1),
        a probe that loses must cost little more than a plain step."""
        k = max(1, min(best_k + 1, cap))
        single = self.curve.estimate(1)
        while k > 1 and single and self.curve.estimate(k + 1) > self.PROBE_COST * single:
            k -= 1
        return k

    def observe(self, accepted: int, draft_s: float, verify_s: float) -> None:
        """A round's outcome, which judges the probe it was, if it was one."""
        if not self._probing:
            return
        # lost: it gave fewer tokens per second than a plain step would have. One that drafted
        # nothing (a confidence stop) lost too, having paid a draft step, and one kept token need
        # not pay for a draft step and a dearer verify.
        single = self.curve.estimate(1)
        lost = accepted == 0 or (single is not None and (accepted + 1) * single < draft_s + verify_s)
        grown, shrunk = 2 * self.interval, max(1, self.interval // 2)
        self.interval = min(grown, self.MAX_PROBE_INTERVAL) if lost else shrunk
        self._probing = False

    def sit_out(self) -> None:
        """`auto` gave this round to another drafter (or to none)."""
        self.idle_rounds += 1

    def recalled(self) -> None:
        """The draft step comes from an earlier start (engine.decoding.drafter_memory): stale until measured."""
        self._stale_after = self.STALE_AFTER
        self.idle_rounds = max(self.idle_rounds, self.STALE_AFTER)

    @property
    def step_is_stale(self) -> bool:
        """The draft step was measured STALE_AFTER rounds ago or more: a new one replaces it outright."""
        return self.idle_rounds >= self.STALE_AFTER

    def refresh_due(self) -> bool:
        """Whether a round that times the stale draft step again may come now."""
        return self.idle_rounds >= self._stale_after

    def refreshing(self) -> None:
        """This round times the stale draft step again; if it still loses, the next waits twice as long."""
        self._refreshing = True
        self._stale_after = min(2 * self._stale_after, self.MAX_PROBE_INTERVAL)

    def drafted(self) -> None:
        """The drafter drafted this round, and its draft step was timed."""
        if not self._refreshing:  # chosen on its price: a later stale step is measured again soon
            self._stale_after = self.STALE_AFTER
        self.idle_rounds, self._refreshing = 0, False


class YieldTracker:
    """Tokens per second a drafter's rounds really gave, decayed as its acceptance counts are.

    A drafter that stops by its confidence drafts fewer tokens than the K it is priced at, so its
    price is capped by this figure, once YIELD_ROUNDS rounds stand behind it: priced for K tokens, the
    shipped head was worth 73-98 tok/s to `auto` where its rounds of one to three tokens gave about
    65, and it drafted in place of the copy.
    """

    YIELD_ROUNDS = 3.0

    def __init__(self):
        self.tokens = self.seconds = self.rounds = 0.0

    def observe(self, tokens: float, seconds: float, decay: float) -> None:
        self.tokens = decay * self.tokens + tokens
        self.seconds = decay * self.seconds + seconds
        self.rounds = decay * self.rounds + 1.0

    def rate(self) -> float | None:
        """Tokens per second (decayed); None before YIELD_ROUNDS rounds."""
        if self.rounds < self.YIELD_ROUNDS or self.seconds <= 0:
            return None
        return self.tokens / self.seconds


class KController:
    """K for one drafter: fixed, or the K in 0..max_k with the best expected tokens per second,
    from the drafter's measured per-position acceptance (engine.decoding.acceptance) and the
    measured verify-cost curve (its `pricer`). A round expected to lose against a plain step is not
    drafted, except for a probe (its `schedule`).
    """

    # At the start of a reply the earlier replies' counts keep this weight: how well a draft does
    # depends on the prompt (a head right 30 % of the time in English is right 5 % in German), so a
    # reply's own first rounds must be able to outweigh them.
    REPLY_MEMORY = 0.3
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
    # After STRETCH_AFTER rounds in a row kept every token they drafted, a round drafts one token past
    # the chosen K where fewer than THIN_EVIDENCE (decayed) rounds stand behind that position's estimate.
    # Rounds that keep all K tokens never decide position K: one early rejection there would otherwise
    # hold K below it for as long as the decay takes to forget that round.
    STRETCH_AFTER, THIN_EVIDENCE = 2, 1.5

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
        self.margin, self.optimism = margin, optimism
        self.acceptance = acceptance or AcceptanceModel()
        self.schedule = ProbeSchedule(curve, probe_every)
        self.yields = YieldTracker()
        self.draft_step_s: float | None = None
        self.plain = False  # the last choice: speculation expected slower than the target alone
        # for a drafter that stops by its own confidence: what each confidence is worth, and the
        # (decayed) share of drafting rounds it stopped before the first token, each a plain step plus
        # one draft step
        self.calibration = ConfidenceCalibration()
        self.empty_share = 0.0
        self.fastest_draft_step_s, self.draft_steps_seen = float("inf"), 0
        self._side_won = self._side_chances = 0.0  # decayed: side nodes kept, and rounds that had the chance
        self._kept_all_streak = 0  # rounds in a row that kept every token they drafted
        self.caps_by_yield = False  # price capped by its rounds' real yield (for_drafter: confidence stops)
        # seconds a plain step and a drafted round spend outside verify and draft (set by the planner)
        self.plain_overhead_s = self.round_overhead_s = 0.0
        # A sampled reply keeps a draft token by rejection sampling, which keeps fewer than a greedy
        # match (a lookup's token is kept with the target's probability of it, not whenever it is the
        # likeliest): greedy and sampled replies each have their own acceptance, confidence
        # calibration and yield, and a sampled reply is priced from sampled rounds only.
        self.sampled = False
        self._other_mode: tuple[AcceptanceModel, ConfidenceCalibration, YieldTracker] | None = None

    @classmethod
    def for_drafter(
        cls, drafter: Drafter, speculation: SpeculationSettings, curve: VerifyCostCurve, **kwargs
    ) -> KController:
        stops_by_confidence = capability(drafter, StopsByConfidence) is not None
        controller = cls(speculation, curve, optimism=0.0 if stops_by_confidence else cls.OPTIMISM, **kwargs)
        controller.caps_by_yield = stops_by_confidence
        return controller

    @property
    def alpha(self) -> float:
        """Acceptance of the first draft token, over every condition (what the stats show)."""
        return self.acceptance.first_position_rate

    @property
    def pricer(self) -> Pricer:
        """The prices of this drafter's rounds as measured now."""
        return Pricer(
            self.acceptance,
            self.curve,
            self.draft_step_s,
            self.empty_share,
            self.optimism,
            self.yields.rate() if self.caps_by_yield else None,
            self.side_acceptance,
            self.plain_overhead_s,
            self.round_overhead_s,
        )

    def set_mode(self, sampled: bool) -> None:
        """Prices the next rounds from what greedy (False) or sampled (True) replies measured: the
        other mode's figures are put aside until a reply of that mode. A mode never seen starts from
        the drafter's prior, held as loosely as an uninformed one (a prior is a greedy check)."""
        if sampled == self.sampled:
            return
        current = (self.acceptance, self.calibration, self.yields)
        if self._other_mode is None:
            model = self.acceptance
            fresh = AcceptanceModel(
                model.positions, model.prior, PRIOR_WEIGHT, model.decay, model.prior_after_accept
            )
            self._other_mode = (fresh, ConfidenceCalibration(), YieldTracker())
        self.acceptance, self.calibration, self.yields = self._other_mode
        self._other_mode, self.sampled = current, sampled

    def choose(self, limit: int, hint: Lookahead | None = None) -> int:
        """K for the next round, at most `limit` (tokens left); 0 means a plain step."""
        hint = hint or Lookahead()
        cap = limit if hint.available is None else min(limit, hint.available)
        if not self.speculation.adaptive:
            return max(0, min(self.speculation.k, cap))
        cap = min(cap, self.speculation.max_k)
        if cap <= 0:
            return 0
        pricer = self.pricer
        best_k, best_rate, plain_rate = pricer.best(cap, hint.condition)
        if best_k is None:  # nothing measured yet: a first probe
            return min(ProbeSchedule.PROBE_K, cap)
        self.plain = best_rate <= plain_rate * (1 + self.margin)
        if not self.plain:
            return self.stretch(best_k, cap)
        # Whether some K would win if the target accepted every draft token, at the fastest draft step
        # measured (one slow step, such as a GPU graph's first capture, must not condemn a drafter). A
        # draft whose step costs about a target step never can (the target drafting for itself on a
        # GPU, where verifying 5 tokens costs 1.07 steps).
        fastest = self.fastest_draft_step_s
        if self.draft_steps_seen >= 2 and not pricer.could_win(cap, plain_rate, fastest, self.margin):
            self.schedule.hopeless()
        return self.schedule.probe_k(best_k, cap) if self.schedule.due() else 0

    def best(self, cap: int, condition=None, step_s: float | None = None) -> tuple[int | None, float, float]:
        """Pricer.best, at the figures measured now."""
        return self.pricer.best(cap, condition, step_s)

    def expected_rate(self, k: int, condition=None, optimism: float = 0.0) -> float | None:
        """Pricer.expected_rate, at the figures measured now."""
        return self.pricer.expected_rate(k, condition, optimism)

    def tree_size(self, k: int, condition=None, limit: int = MAX_TREE_SIZE) -> int:
        """Pricer.tree_size, at the figures measured now."""
        return self.pricer.tree_size(k, condition, limit)

    def refresh_k(self, cap: int, condition, rate_to_beat: float) -> int | None:
        """K for a round that measures a stale draft step again (see ProbeSchedule), when this drafter
        would beat `rate_to_beat` if drafting cost nothing; None otherwise."""
        if not self.schedule.refresh_due() or self.draft_step_s is None:
            return None
        k, rate, _ = self.best(cap, condition, step_s=0.0)
        if k is None or rate <= rate_to_beat:
            return None
        self.schedule.refreshing()
        return k

    def measured_rate(self) -> float | None:
        """Tokens per second this drafter's rounds really gave (YieldTracker.rate)."""
        return self.yields.rate()

    @property
    def side_acceptance(self) -> float:
        """How often a side node is kept where the main branch was rejected beside it."""
        prior = self.SIDE_PRIOR * self.SIDE_PRIOR_WEIGHT
        return (self._side_won + prior) / (self._side_chances + self.SIDE_PRIOR_WEIGHT)

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
        self.schedule.start_reply()

    def stretch(self, k: int, cap: int) -> int:
        """k, or k + 1 where the rounds kept everything lately and position k is barely measured."""
        if self._kept_all_streak < self.STRETCH_AFTER or k >= cap:
            return k
        if self.acceptance.decided(k) >= self.THIN_EVIDENCE:
            return k
        self._kept_all_streak = 0
        return k + 1

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
        decay = self.acceptance.decay
        if tree:
            self.curve.observe_tree(verify_size or drafted + 1, verify_s)
            if side_chance:  # remembered as long as the acceptance counts are
                self._side_won = decay * self._side_won + side_won
                self._side_chances = decay * self._side_chances + 1.0
        else:
            self.curve.observe(verify_size or drafted + 1, verify_s)
        if k > 0:
            self.empty_share = 0.95 * self.empty_share + (0.05 if drafted == 0 else 0.0)
            self.yields.observe(accepted + 1 + side_won, draft_s + verify_s, decay)
        self.schedule.observe(accepted, draft_s, verify_s)
        if drafted == 0:
            return
        self._kept_all_streak = self._kept_all_streak + 1 if accepted >= drafted else 0
        self.acceptance.observe(drafted, accepted, condition)
        step = draft_s / drafted
        stale = self.schedule.step_is_stale
        self.draft_step_s = (
            step if self.draft_step_s is None or stale else 0.8 * self.draft_step_s + 0.2 * step
        )
        self.schedule.drafted()
        self.fastest_draft_step_s = min(self.fastest_draft_step_s, step)
        self.draft_steps_seen += 1

    def note(self) -> str:
        if not self.plain:
            return ""
        return (
            f"Speculation measured slower than the target alone here (acceptance {self.alpha:.0%}); "
            f"decoding plainly and re-trying every {self.schedule.interval} rounds."
        )
