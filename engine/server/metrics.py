"""Counters for `/metrics`, written in Prometheus' text format by prometheus_client.

The speculative counters carry vLLM's names (`<prefix>:spec_decode_num_drafts_total`, ...,
`..._num_accepted_tokens_per_pos_total{position="i"}`) with Tandem's prefix, so a dashboard built for
vLLM reads them unchanged once the prefix is swapped (engine.remote.metrics_page reads either page).

`request_total{outcome}` counts the chat requests the engine took (completed, cancelled, error),
turned away for a full queue (busy) or lost to a client that hung up during its upload
(disconnected); `request_errors_total{code}` counts every answer sent with an error status, by HTTP
code, on any route: a bad request (400), a missing key (401), a refused host or origin (403), a body
too slow (408), too large (413) or not JSON (415), a full queue (503). An error inside a stream
already started is sent with status 200, so only `request_total{outcome="error"}` counts it; a client
that left is no error (499, counted as cancelled or disconnected).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from engine.stats import GenerationStats

PREFIX = "tandem"
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
    # HTTP status -> answers with it, every route and refusal included (4xx and 5xx)
    errors: dict[int, int] = field(default_factory=dict)
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

    def count_error(self, status: int) -> None:
        with self._lock:
            self.errors[status] = self.errors.get(status, 0) + 1

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
        """The page in Prometheus' text format (prometheus_client's generate_latest)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Snapshot(self._families(model)))
        return generate_latest(registry).decode()

    def _families(self, model: str) -> list[Metric]:
        label = {"model_name": model}

        def counter(name: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> Metric:
            family = Metric(f"{PREFIX}:{name}", help_text, "counter")
            for labels, value in samples:
                family.add_sample(f"{PREFIX}:{name}_total", {**label, **labels}, value)
            return family

        with self._lock:
            families = [
                counter(
                    "request",
                    "Chat completion requests by outcome.",
                    [({"outcome": o}, n) for o, n in sorted(self.requests.items())],
                ),
                counter(
                    "request_errors",
                    "Requests answered with an error status (4xx, 5xx), by HTTP code.",
                    [({"code": str(c)}, n) for c, n in sorted(self.errors.items())],
                ),
                counter("prompt_tokens", "Prompt tokens read.", [({}, self.prompt_tokens)]),
                counter("generation_tokens", "Tokens generated.", [({}, self.generation_tokens)]),
                counter(
                    "spec_decode_num_drafts", "Speculative rounds that drafted.", [({}, self.num_drafts)]
                ),
                counter(
                    "spec_decode_num_draft_tokens", "Draft tokens proposed.", [({}, self.num_draft_tokens)]
                ),
                counter(
                    "spec_decode_num_accepted_tokens",
                    "Draft tokens accepted.",
                    [({}, self.num_accepted_tokens)],
                ),
                counter(
                    PER_POS_NAME,
                    "Draft tokens accepted at each position of a round.",
                    [({"position": str(i)}, n) for i, n in enumerate(self.accepted_per_pos)],
                ),
            ]
            depth = Metric(f"{PREFIX}:queue_depth", "Requests waiting or running.", "gauge")
            depth.add_sample(f"{PREFIX}:queue_depth", label, self.queue_depth)
            latencies = list(self.cancel_latencies_s)
        name = f"{PREFIX}:cancel_latency_seconds"
        summary = Metric(name, "Client disconnect to engine stop.", "summary")
        for q in (0.5, 0.95) if latencies else ():
            summary.add_sample(name, {**label, "quantile": str(q)}, quantile(latencies, q))
        summary.add_sample(f"{name}_sum", label, sum(latencies))
        summary.add_sample(f"{name}_count", label, len(latencies))
        return [*families, depth, summary]


class _Snapshot:
    """A collector that hands prometheus_client the families taken under the metrics' lock."""

    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families
