"""Counters for `/metrics`, in Prometheus' text format, and a parser for that format.

The speculative counters carry vLLM's names (`<prefix>:spec_decode_num_drafts_total`, ...,
`..._num_accepted_tokens_per_pos_total{position="i"}`) with Tandem's prefix, so a dashboard built for
vLLM reads them unchanged once the prefix is swapped. `parse_prometheus` reads either server's page.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field

from engine.stats import GenerationStats

PREFIX = "tandem"
SPEC_NAMES = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
PER_POS_NAME = "spec_decode_num_accepted_tokens_per_pos"


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class ServerMetrics:
    requests: dict[str, int] = field(default_factory=dict)  # outcome -> count
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_drafts: int = 0  # speculative rounds that drafted at least one token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    # seconds from a client's disconnect to the engine stopping, one value per cancelled request
    cancel_latencies_s: list[float] = field(default_factory=list)
    queue_depth: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_request(self, outcome: str) -> None:
        with self._lock:
            self.requests[outcome] = self.requests.get(outcome, 0) + 1

    def add_generation(self, stats: GenerationStats) -> None:
        with self._lock:
            self.prompt_tokens += stats.prompt_tokens
            self.generation_tokens += stats.generated_tokens
            # a round drafted iff its first position was proposed
            self.num_drafts += stats.per_position_drafted[0] if stats.per_position_drafted else 0
            self.num_draft_tokens += stats.drafted
            self.num_accepted_tokens += stats.accepted
            for i, accepted in enumerate(stats.per_position_accepted):
                if i >= len(self.accepted_per_pos):
                    self.accepted_per_pos.append(0)
                self.accepted_per_pos[i] += accepted

    def add_cancel_latency(self, seconds: float) -> None:
        with self._lock:
            self.cancel_latencies_s.append(seconds)

    def render(self, model: str) -> str:
        label = f'model_name="{_escape(model)}"'
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, str, float]]) -> None:
            lines.append(f"# HELP {PREFIX}:{name} {help_text}")
            lines.append(f"# TYPE {PREFIX}:{name} {kind}")
            for suffix, labels, value in samples:
                lines.append(f"{PREFIX}:{name}{suffix}{{{labels}}} {_number(value)}")

        with self._lock:
            metric(
                "request_total", "counter", "Chat completion requests by outcome.",
                [("", f'{label},outcome="{o}"', n) for o, n in sorted(self.requests.items())],
            )  # fmt: skip
            metric("prompt_tokens", "counter", "Prompt tokens read.", [("_total", label, self.prompt_tokens)])
            metric(
                "generation_tokens",
                "counter",
                "Tokens generated.",
                [("_total", label, self.generation_tokens)],
            )
            metric(
                "spec_decode_num_drafts",
                "counter",
                "Speculative rounds that drafted.",
                [("_total", label, self.num_drafts)],
            )
            metric(
                "spec_decode_num_draft_tokens",
                "counter",
                "Draft tokens proposed.",
                [("_total", label, self.num_draft_tokens)],
            )
            metric(
                "spec_decode_num_accepted_tokens",
                "counter",
                "Draft tokens accepted.",
                [("_total", label, self.num_accepted_tokens)],
            )
            metric(
                PER_POS_NAME, "counter", "Draft tokens accepted at each position of a round.",
                [("_total", f'{label},position="{i}"', n) for i, n in enumerate(self.accepted_per_pos)],
            )  # fmt: skip
            metric("queue_depth", "gauge", "Requests waiting or running.", [("", label, self.queue_depth)])
            latencies = list(self.cancel_latencies_s)
            samples = [
                ("", f'{label},quantile="{q}"', quantile(latencies, q)) for q in (0.5, 0.95) if latencies
            ]
            samples += [("_sum", label, sum(latencies)), ("_count", label, len(latencies))]
            metric("cancel_latency_seconds", "summary", "Client disconnect to engine stop.", samples)
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) for every sample line of a Prometheus text page; comments are skipped."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        labels = {
            k: bytes(v, "utf-8").decode("unicode_escape") for k, v in _LABEL.findall(match["labels"] or "")
        }
        samples.append((match["name"], labels, value))
    return samples


@dataclass(frozen=True)
class SpecCounters:
    """The speculative counters of one /metrics page, summed over engines and models."""

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    accepted_per_pos: tuple[float, ...]

    def minus(self, before: SpecCounters) -> SpecCounters:
        positions = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        pad = lambda values: list(values) + [0.0] * (positions - len(values))  # noqa: E731
        return SpecCounters(
            self.num_drafts - before.num_drafts,
            self.num_draft_tokens - before.num_draft_tokens,
            self.num_accepted_tokens - before.num_accepted_tokens,
            tuple(
                a - b for a, b in zip(pad(self.accepted_per_pos), pad(before.accepted_per_pos), strict=True)
            ),
        )


def spec_counters(text: str) -> SpecCounters | None:
    """vLLM-style speculative counters under any prefix (vllm:, tandem:); None when the page has none."""
    totals = dict.fromkeys(SPEC_NAMES, 0.0)
    per_pos: dict[int, float] = {}
    found = False
    for name, labels, value in parse_prometheus(text):
        base = name.split(":", 1)[-1].removesuffix("_total")
        if base in totals:
            totals[base] += value
            found = True
        elif base == PER_POS_NAME and "position" in labels:
            position = int(labels["position"])
            per_pos[position] = per_pos.get(position, 0.0) + value
            found = True
    if not found:
        return None
    accepted_per_pos = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return SpecCounters(*(totals[n] for n in SPEC_NAMES), accepted_per_pos)
