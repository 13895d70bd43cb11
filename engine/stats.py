"""Generation statistics: a plain dataclass, filled by the speculative loop after every round."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, fields

# plain steps a reply needs before its own figure replaces the calibration as the baseline; the loop
# takes that many target-alone steps inside a reply that drafts every round (speculative.PlainProbe)
MIN_PLAIN_STEPS = 4
# a speed-up within this fraction of 1 is "about the same": neither faster nor slower
SAME_SPEED_TOLERANCE = 0.03
# A round that took more than this many times the median of its kind (plain steps, or rounds that
# drafted as many tokens) was held up by another program on a busy machine; it counts at that median,
# on both sides of the speed-up. With a busy loop per core one plain step in a reply took 10x the
# others, and a figure from four plain steps read x7.20 where the reply ran 1.9x the target alone.
STALL_FACTOR = 2.5


@dataclass
class GenerationStats:
    drafter: str = "none"  # "none", "ngram", "suffix", "auto" or "model:<name>"
    k_mode: str = "adaptive"  # "adaptive" or "fixed"
    current_k: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually computed; the rest came from the cache of earlier turns
    # per_position_*[i]: how often a draft token was proposed / accepted at position i of a round
    per_position_drafted: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    # tokens emitted per round: accepted draft tokens plus the target's own token
    accepted_lengths: list[int] = field(default_factory=list)
    k_history: list[int] = field(default_factory=list)
    # the drafter each round used ("none" for a plain step), parallel to k_history
    drafter_history: list[str] = field(default_factory=list)
    # rounds whose every draft token was thrown away; verify positions run as padding (cheaper sizes)
    wasted_rounds: int = 0
    padded_tokens: int = 0
    # token trees (engine.decoding.tree): rounds verified as a tree, the extra nodes they held, and
    # the rounds whose accepted path went through one of those nodes
    tree_rounds: int = 0
    tree_nodes: int = 0
    off_chain_rounds: int = 0
    # plain steps inside this reply and their total seconds: the target alone, in the same conditions.
    # Each round is timed whole (planning, drafting, verifying, publishing its tokens), plain or not,
    # so a plain round and a drafted one are costed alike: round_time_s over round_tokens is the
    # reply's cost per token, plain_step_time_s over plain_steps the target alone's at the same moment
    plain_steps: int = 0
    plain_step_time_s: float = 0.0
    round_time_s: float = 0.0
    round_tokens: int = 0
    round_seconds: list[float] = field(default_factory=list)  # each round's time, parallel to k_history
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    prefill_time_s: float = 0.0
    total_time_s: float = 0.0
    ttft_s: float | None = None
    # one plain target step (one token, warm cache), measured on this device in this session
    target_step_time_s: float | None = None
    fallback_to_plain: bool = False
    # what adaptive K works from: estimated acceptance rate, seconds per draft step,
    # and seconds per target forward over n new tokens (n -> s)
    alpha_estimate: float | None = None
    draft_step_time_s: float | None = None
    verify_forward_s: dict[int, float] = field(default_factory=dict)
    note: str = ""
    # who measured these figures: "local" (this engine) or the server that answered ("tandem-server",
    # "llama.cpp", "vllm-metrics", "openai-compatible"); `unreported` names the fields and properties
    # that server did not report, which a view shows as "not reported by this server", never as 0.
    source: str = "local"
    unreported: list[str] = field(default_factory=list)

    @property
    def rejected(self) -> int:
        return self.drafted - self.accepted

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        return sum(self.accepted_lengths) / len(self.accepted_lengths) if self.accepted_lengths else None

    @property
    def decode_time_s(self) -> float:
        return self.total_time_s - self.prefill_time_s

    @property
    def tokens_per_s(self) -> float | None:
        return self.generated_tokens / self.total_time_s if self.total_time_s > 0 else None

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """Prompt tokens read per second: the tokens computed (not those cached) over the prompt's time."""
        return (
            self.prefill_tokens / self.prefill_time_s
            if self.prefill_tokens and self.prefill_time_s > 0
            else None
        )

    @property
    def decode_tokens_per_s(self) -> float | None:
        decode = self.decode_time_s
        return self.generated_tokens / decode if decode > 0 else None

    @property
    def all_plain(self) -> bool:
        """Every round of this reply was a plain step: the reply is the target alone, its own baseline."""
        return self.rounds > 0 and self.plain_steps == self.rounds

    def steady_times(self) -> tuple[float, float]:
        """(plain steps' seconds, all rounds' seconds) with every stalled round (STALL_FACTOR) counted
        at the median of its kind; the plain sums as kept when the rounds' own times are not."""
        times, kinds = self.round_seconds, self.k_history
        if not times or len(times) != len(kinds):
            return self.plain_step_time_s, self.round_time_s
        by_kind: dict[int, list[float]] = {}
        for seconds, kind in zip(times, kinds, strict=True):
            by_kind.setdefault(kind, []).append(seconds)
        medians = {kind: statistics.median(values) for kind, values in by_kind.items()}
        steady = [
            seconds if seconds <= STALL_FACTOR * medians[kind] else medians[kind]
            for seconds, kind in zip(times, kinds, strict=True)
        ]
        return sum(t for t, kind in zip(steady, kinds, strict=True) if kind == 0), sum(steady)

    @property
    def baseline_step_s(self) -> float | None:
        """Seconds per token of the target alone: this reply's own plain steps when it has enough (the
        same context, the same machine load, the same moment), else the engine's calibration."""
        if self.plain_steps and (self.plain_steps >= MIN_PLAIN_STEPS or self.all_plain):
            return self.steady_times()[0] / self.plain_steps
        return self.target_step_time_s

    @property
    def speedup_is_estimate(self) -> bool:
        """True when the baseline is the calibration (taken at another moment) rather than plain steps
        of this very reply."""
        return not (self.plain_steps >= MIN_PLAIN_STEPS or self.all_plain)

    @property
    def speedup(self) -> float | None:
        """Decode speed against the target alone: its time per token (`baseline_step_s`) over this
        reply's. The one figure every view shows; `speedup_text` says whether it is an estimate. A reply
        decoded plainly throughout is its own baseline: ×1.00 by construction."""
        baseline = self.baseline_step_s
        if not baseline:
            return None
        round_time = self.steady_times()[1]
        if self.round_tokens and round_time > 0:
            per_token = round_time / self.round_tokens
        elif self.generated_tokens and self.decode_time_s > 0:  # a record kept before rounds were timed
            per_token = self.decode_time_s / self.generated_tokens
        else:
            return None
        return baseline / per_token

    @property
    def verdict(self) -> str:
        """The one rule for what a reply says about drafting; every view (the panel, the footer, an
        export) words this and nothing else: "target alone" (no drafter), "plain" (nothing drafted),
        "none accepted" (drafts, none kept), "about the same" (`speedup` within SAME_SPEED_TOLERANCE
        of 1: ×0.97 to ×1.03), "faster" / "slower" (above / below that), or "unmeasured" (no baseline,
        or a server that did not report it). A reply that drafted in some rounds and fell back to
        plain steps in others is judged by its speed-up over the whole reply."""
        if self.drafter == "none":
            return "target alone"
        if self.drafted == 0:
            return "plain"
        if self.accepted == 0:
            return "none accepted"
        speedup = self.speedup
        if speedup is None or "speedup" in self.unreported:
            return "unmeasured"
        return speed_verdict(speedup)

    def speedup_text(self) -> str:
        """e.g. "×1.42 (estimate)": the label for the panel and the footer alike."""
        speedup = self.speedup
        if speedup is None:
            return "—"
        basis = "estimate" if self.speedup_is_estimate else "measured in this reply"
        return f"×{speedup:.2f} ({basis})"

    @property
    def drafter_rounds(self) -> dict[str, int]:
        """Rounds per drafter ("none": plain steps)."""
        counts: dict[str, int] = {}
        for name in self.drafter_history:
            counts[name] = counts.get(name, 0) + 1
        return counts

    def per_position_acceptance(self) -> list[float]:
        return [
            a / d if d else 0.0
            for a, d in zip(self.per_position_accepted, self.per_position_drafted, strict=False)
        ]

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(
            rejected=self.rejected,
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            tokens_per_s=self.tokens_per_s,
            decode_tokens_per_s=self.decode_tokens_per_s,
            speedup=self.speedup,
            speedup_is_estimate=self.speedup_is_estimate,
            verdict=self.verdict,
            baseline_step_s=self.baseline_step_s,
            drafter_rounds=self.drafter_rounds,
            per_position_acceptance=self.per_position_acceptance(),
        )
        return data

    def copy(self) -> GenerationStats:
        """An independent copy. Sent after every round, so not asdict's deep copy: that walks every list
        element and made each round cost more than the last (1.3 ms a token at 128 tokens)."""
        values = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            values[spec.name] = value.copy() if isinstance(value, list | dict) else value  # flat: ints, strs
        return GenerationStats(**values)


def speed_verdict(speedup: float) -> str:
    """ "faster", "slower" or "about the same" (within SAME_SPEED_TOLERANCE of ×1.00), judged on the
    figure as shown (two decimals), so "×1.03" never reads "faster" when "×1.03" is "about the same"."""
    if abs(round(speedup, 2) - 1) <= SAME_SPEED_TOLERANCE + 1e-9:
        return "about the same"
    return "faster" if speedup > 1 else "slower"
