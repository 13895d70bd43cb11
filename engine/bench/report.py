"""Tallies of a benchmark run, the JSON report and its table."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.bench.methods import Method

import json
from pathlib import Path

from engine.bench.records import PromptRecord, Tally

SUMMARY_FIELDS = (
    "tokens_per_s",
    "decode_tokens_per_s",
    "speedup_vs_baseline",
    "speedup_vs_llama_cpp",
    "speedup_vs_hf_plain",
    "acceptance_rate",
    "mean_accepted_length",
    "greedy_identical",
    "ttft_s",
)


def identical_fraction(records: list[PromptRecord], baseline: dict) -> float | None:
    """Share of `records` whose tokens equal baseline's (question_id -> per-turn tokens) exactly."""
    pairs = [(r, baseline.get(r.question_id)) for r in records]
    pairs = [(r, b) for r, b in pairs if b is not None]
    if not pairs:
        return None
    return sum(r.token_ids == b for r, b in pairs) / len(pairs)


def summarize(tally: Tally, reference_tps: dict[str, float | None], identical: float | None) -> dict:
    tps = tally.tokens_per_s
    return {
        "tokens_per_s": tps,
        "decode_tokens_per_s": tally.decode_tokens_per_s,
        "speedup_vs_baseline": ratio(tps, reference_tps.get("baseline")),
        "speedup_vs_hf_plain": ratio(tps, reference_tps.get("hf-plain")),
        "speedup_vs_llama_cpp": ratio(tps, reference_tps.get("llama-cpp")),
        "decode_speedup_vs_baseline": ratio(tally.decode_tokens_per_s, reference_tps.get("baseline:decode")),
        "decode_speedup_vs_llama_cpp": ratio(
            tally.decode_tokens_per_s, reference_tps.get("llama-cpp:decode")
        ),
        "acceptance_rate": tally.acceptance_rate,
        "mean_accepted_length": tally.mean_accepted_length,
        "greedy_identical": identical,
        "ttft_s": tally.ttft_s,
        "generated_tokens": tally.generated_tokens,
        "time_s": tally.time_s,
        "calls": tally.calls,
        "alpha": tally.alpha,
        "mean_k": tally.mean_k,
        "k_distribution": {str(k): n for k, n in sorted(tally.k_counts.items())},
        "draft_step_s": tally.draft_step_s,
        "tree_rounds": tally.tree_rounds,
        "tree_nodes": tally.tree_nodes,
        "off_chain_rounds": tally.off_chain_rounds,
    }


def ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def sum_tallies(records: list[PromptRecord]) -> Tally:
    total = Tally()
    for record in records:
        total.add(record.tally)
    return total


def reference_speeds(records: list[PromptRecord], methods: list[Method]) -> dict[str, float | None]:
    """tokens/s of the reference methods (by kind: baseline, hf-plain, llama-cpp) over `records`, and
    their decode-only tokens/s under "<kind>:decode"."""
    speeds: dict[str, float | None] = {}
    for method in methods:
        if method.kind in ("baseline", "hf-plain", "llama-cpp"):
            total = sum_tallies([r for r in records if r.method == method.name])
            speeds[method.kind] = total.tokens_per_s
            speeds[f"{method.kind}:decode"] = total.decode_tokens_per_s
    return speeds


def aggregate(
    records: list[PromptRecord],
    methods: list[Method],
    greedy: bool,
    extras: dict[str, dict] | None = None,
) -> dict:
    """The report's "methods" and "prompts" sections from per-prompt records."""
    baseline = next((m.name for m in methods if m.kind == "baseline"), None)
    baseline_tokens = (
        {r.question_id: r.token_ids for r in records if r.method == baseline} if greedy and baseline else {}
    )
    categories = list(dict.fromkeys(r.category for r in records))
    overall_refs = reference_speeds(records, methods)
    category_refs = {
        c: reference_speeds([r for r in records if r.category == c], methods) for c in categories
    }
    check_identity = bool(baseline_tokens)

    methods_section = {}
    for method in methods:
        own = [r for r in records if r.method == method.name]
        summary = {"kind": method.kind, "k": method.k_label}
        summary.update(
            summarize(sum_tallies(own), overall_refs, identity(own, baseline_tokens, check_identity))
        )
        summary.update((extras or {}).get(method.name, {}))
        summary["by_category"] = {
            category: summarize(
                sum_tallies(in_category := [r for r in own if r.category == category]),
                category_refs[category],
                identity(in_category, baseline_tokens, check_identity),
            )
            for category in categories
        }
        methods_section[method.name] = summary

    prompts_section = []
    for question_id in dict.fromkeys(r.question_id for r in records):
        own = {r.method: r for r in records if r.question_id == question_id}
        first = next(iter(own.values()))
        refs = reference_speeds(list(own.values()), methods)
        prompts_section.append(
            {
                "question_id": question_id,
                "category": first.category,
                "turns": len(first.token_ids),
                "methods": {
                    name: summarize(record.tally, refs, identity([record], baseline_tokens, check_identity))
                    for name, record in own.items()
                },
            }
        )
    return {"methods": methods_section, "prompts": prompts_section}


def identity(records: list[PromptRecord], baseline_tokens: dict, enabled: bool) -> float | None:
    return identical_fraction(records, baseline_tokens) if enabled else None


def build_report(
    config: dict, records: list[PromptRecord], methods: list[Method], greedy: bool, extras=None
) -> dict:
    report = {"config": config}
    report.update(aggregate(records, methods, greedy, extras))
    return report


def write_report(report: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
    temporary.replace(path)
    return path


def format_table(report: dict) -> str:
    """Per method: wall and decode-only speed, speed-ups, acceptance, TTFT, identity; then speed-up vs
    baseline per category."""
    methods = report["methods"]
    header = [
        "method",
        "tok/s",
        "decode",
        "vs base",
        "vs llama.cpp",
        "vs hf-plain",
        "accept",
        "mean len",
        "TTFT ms",
        "identical",
        "K dist",
    ]
    rows = [
        [
            name,
            fmt(m["tokens_per_s"], "{:.2f}"),
            fmt(m.get("decode_tokens_per_s"), "{:.1f}"),
            fmt(m["speedup_vs_baseline"], "{:.2f}x"),
            fmt(m.get("speedup_vs_llama_cpp"), "{:.2f}x"),
            fmt(m["speedup_vs_hf_plain"], "{:.2f}x"),
            fmt(m["acceptance_rate"], "{:.0%}"),
            fmt(m["mean_accepted_length"], "{:.2f}"),
            fmt(m["ttft_s"] * 1000 if m["ttft_s"] is not None else None, "{:.0f}"),
            fmt(m["greedy_identical"], "{:.0%}"),
            format_k_distribution(m.get("k_distribution") or {}),
        ]
        for name, m in methods.items()
    ]
    lines = [render_rows(header, rows)]
    categories = list(next(iter(methods.values()))["by_category"]) if methods else []
    if categories and any(m["speedup_vs_baseline"] is not None for m in methods.values()):
        cat_header = ["speed-up vs baseline"] + categories
        cat_rows = [
            [name] + [fmt(m["by_category"][c]["speedup_vs_baseline"], "{:.2f}x") for c in categories]
            for name, m in methods.items()
        ]
        lines += ["", render_rows(cat_header, cat_rows)]
    return "\n".join(lines)


def format_k_distribution(distribution: dict[str, int], top: int = 3) -> str:
    total = sum(distribution.values())
    if not total or set(distribution) == {"0"}:
        return "-"
    common = sorted(distribution.items(), key=lambda item: -item[1])[:top]
    return " ".join(f"{k}:{n / total:.0%}" for k, n in common)


def fmt(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def render_rows(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]

    def line(cells):
        return "  ".join(
            str(cell).ljust(width) if i == 0 else str(cell).rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(row) for row in rows])
