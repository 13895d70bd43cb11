"""Generation statistics: a plain dataclass, filled by the speculative loop after every round."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationStats:
    drafter: str = "none"  # "none", "ngram" or "model:<name>"
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
    def decode_tokens_per_s(self) -> float | None:
        decode = self.decode_time_s
        return self.generated_tokens / decode if decode > 0 else None

    @property
    def speedup(self) -> float | None:
        """Decode speed against the target alone: its measured step time over our time per token."""
        if not self.target_step_time_s or not self.generated_tokens or self.decode_time_s <= 0:
            return None
        return self.target_step_time_s * self.generated_tokens / self.decode_time_s

    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.per_position_accepted, self.per_position_drafted, strict=False)]

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(
            rejected=self.rejected,
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            tokens_per_s=self.tokens_per_s,
            decode_tokens_per_s=self.decode_tokens_per_s,
            speedup=self.speedup,
        )
        return data

    def copy(self) -> GenerationStats:
        return GenerationStats(**asdict(self))
