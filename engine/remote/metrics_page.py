"""The speculative counters of a server's /metrics page (vLLM's, llama.cpp's or Tandem's), read with
prometheus_client's parser.

vLLM names them `vllm:spec_decode_num_drafts_total`, ..., `..._num_accepted_tokens_per_pos_total
{position="i"}`; Tandem's server uses the same names under its own prefix. Each is summed over the
page's series (one per engine under data parallelism, one per model).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

SPEC_NAMES = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
PER_POS_NAME = "spec_decode_num_accepted_tokens_per_pos"


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) for every sample of a Prometheus text page; ValueError if it is not one."""
    return [
        (sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


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
    """vLLM-style speculative counters under any prefix (vllm:, tandem:); None when the page has none
    or is not a Prometheus page."""
    try:
        samples = parse_prometheus(text)
    except ValueError:
        return None
    totals = dict.fromkeys(SPEC_NAMES, 0.0)
    per_pos: dict[int, float] = {}
    found = False
    for name, labels, value in samples:
        base = name.split(":", 1)[-1].removesuffix("_total")
        if base in totals:
            totals[base] += value
            found = True
        elif base == PER_POS_NAME and labels.get("position", "").isdigit():
            position = int(labels["position"])
            per_pos[position] = per_pos.get(position, 0.0) + value
            found = True
    if not found:
        return None
    accepted_per_pos = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return SpecCounters(*(totals[n] for n in SPEC_NAMES), accepted_per_pos)
