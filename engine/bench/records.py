"""What one benchmark run records: per-call tallies, turns and prompts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Tally:
    """Additive counters for one call, or summed over turns, prompts, categories."""

    calls: int = 0
    generated_tokens: int = 0
    time_s: float = 0.0
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    # decoding alone: the tokens after each call's first and the time after it (llama.cpp's own
    # figures for llama-server), so that prefill and the first token do not weigh on it
    decode_tokens: int = 0
    decode_time_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    round_tokens: int = 0
    draft_time_s: float = 0.0
    # per draft position: how often it was reached (every earlier draft token accepted) and accepted
    position_reached: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    k_counts: Counter = field(default_factory=Counter)
    # token trees: rounds verified as a tree, their nodes off the main branch, and rounds whose
    # accepted path left the main branch (tokens a chain would not have kept)
    tree_rounds: int = 0
    tree_nodes: int = 0
    off_chain_rounds: int = 0

    def add(self, other: Tally) -> Tally:
        self.calls += other.calls
        self.generated_tokens += other.generated_tokens
        self.time_s += other.time_s
        self.ttft_sum_s += other.ttft_sum_s
        self.ttft_count += other.ttft_count
        self.decode_tokens += other.decode_tokens
        self.decode_time_s += other.decode_time_s
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.rounds += other.rounds
        self.round_tokens += other.round_tokens
        self.draft_time_s += other.draft_time_s
        self.position_reached = add_lists(self.position_reached, other.position_reached)
        self.position_accepted = add_lists(self.position_accepted, other.position_accepted)
        self.k_counts.update(other.k_counts)
        self.tree_rounds += other.tree_rounds
        self.tree_nodes += other.tree_nodes
        self.off_chain_rounds += other.off_chain_rounds
        return self

    def record_round(self, drafted: int, accepted: int) -> None:
        """One verification round: `drafted` proposed, the first `accepted` of them kept."""
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.round_tokens += accepted + 1
        self.k_counts[drafted] += 1
        reached = min(drafted, accepted + 1)
        self.position_reached = add_lists(self.position_reached, [1] * reached)
        self.position_accepted = add_lists(self.position_accepted, [1] * accepted)

    @property
    def tokens_per_s(self) -> float | None:
        return self.generated_tokens / self.time_s if self.time_s > 0 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_time_s if self.decode_time_s > 0 else None

    def time_first_token(self, first_token_s: float) -> None:
        """One call's first token came `first_token_s` after it began: its TTFT, and the decoding after."""
        self.ttft_sum_s, self.ttft_count = first_token_s, 1
        if self.generated_tokens > 1:
            self.decode_tokens = self.generated_tokens - 1
            self.decode_time_s = max(self.time_s - first_token_s, 0.0)

    @property
    def ttft_s(self) -> float | None:
        return self.ttft_sum_s / self.ttft_count if self.ttft_count else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        return self.round_tokens / self.rounds if self.rounds and self.drafted else None

    @property
    def alpha(self) -> float | None:
        """Per-token acceptance probability, as the E(K) formula means it: accepted / positions reached."""
        reached = sum(self.position_reached)
        return sum(self.position_accepted) / reached if reached else None

    @property
    def mean_k(self) -> float | None:
        """Mean draft length per round; None for a method that never drafted."""
        total = sum(self.k_counts.values())
        if not total or not self.drafted:
            return None
        return sum(k * n for k, n in self.k_counts.items()) / total

    @property
    def draft_step_s(self) -> float | None:
        return self.draft_time_s / self.drafted if self.drafted and self.draft_time_s > 0 else None


def add_lists(a: list[int], b: list[int]) -> list[int]:
    longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
    return [x + (shorter[i] if i < len(shorter) else 0) for i, x in enumerate(longer)]


def tally_from_stats(stats) -> Tally:
    """Round counters from the engine's GenerationStats."""
    reached = [
        min(drafted, accepted_before)
        for drafted, accepted_before in zip(
            stats.per_position_drafted,
            [stats.rounds] + list(stats.per_position_accepted[:-1]),
            strict=False,
        )
    ]
    return Tally(
        drafted=stats.drafted,
        accepted=stats.accepted,
        rounds=stats.rounds,
        round_tokens=sum(stats.accepted_lengths),
        draft_time_s=stats.draft_time_s,
        position_reached=reached,
        position_accepted=list(stats.per_position_accepted),
        k_counts=Counter(stats.k_history),
        tree_rounds=stats.tree_rounds,
        tree_nodes=stats.tree_nodes,
        off_chain_rounds=stats.off_chain_rounds,
    )


@dataclass
class TurnResult:
    token_ids: list[int]
    text: str
    tally: Tally


@dataclass
class PromptRecord:
    """One prompt answered by one method: every turn."""

    question_id: int | str
    category: str
    method: str
    token_ids: list[list[int]] = field(default_factory=list)  # per turn
    tally: Tally = field(default_factory=Tally)
