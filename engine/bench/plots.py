"""PNG plots of a benchmark report (the dict `tandem-cli bench --json` writes), drawn with matplotlib's Agg backend.

- speedup_vs_k.png: speed-up against `baseline` for each fixed K of a sweep, adaptive K as a line.
- acceptance_by_category.png: acceptance rate per category for every method that drafts.
- speedup_theory.png: measured speed-up against the theoretical E(K) / (1 + K c), where
  E(K) = (1 - a^(K+1)) / (1 - a), a is the measured per-token acceptance and c = t_draft / t_target
  for one step. Where the target's verify cost over K+1 tokens was measured, a second curve divides
  by K c + t_verify(K+1) / t_verify(1) instead, since verifying K tokens is not free on every device.
"""

from __future__ import annotations

from pathlib import Path

from engine.decoding.adaptive import expected_tokens

SWEEP_FAMILIES = ("tandem", "tandem-ngram")


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def theoretical_speedup(alpha: float, c: float, k: int) -> float:
    """E(K) / (1 + K c): tokens per round over the round's cost in target steps (verify assumed flat)."""
    return expected_tokens(alpha, k) / (1.0 + k * c)


def verify_aware_speedup(alpha: float, c: float, k: int, verify_ratio: float) -> float:
    return expected_tokens(alpha, k) / (k * c + verify_ratio)


def family_methods(report: dict, family: str) -> list[tuple[str, dict]]:
    return [(name, m) for name, m in report["methods"].items() if m.get("kind") == family]


def fixed_k_points(
    methods: list[tuple[str, dict]], key: str = "speedup_vs_baseline"
) -> list[tuple[int, float]]:
    points = [
        (int(m["k"]), m[key]) for _, m in methods if m.get("k") != "adaptive" and m.get(key) is not None
    ]
    return sorted(points)


def write_plots(report: dict, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [
        plot_speedup_vs_k(report, out / "speedup_vs_k.png"),
        plot_acceptance_by_category(report, out / "acceptance_by_category.png"),
        plot_theory(report, out / "speedup_theory.png"),
    ]


def plot_speedup_vs_k(report: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for index, family in enumerate(SWEEP_FAMILIES):
        methods = family_methods(report, family)
        color = f"C{index}"
        points = fixed_k_points(methods)
        if points:
            ax.plot(
                [k for k, _ in points], [s for _, s in points], "o-", color=color, label=f"{family}, fixed K"
            )
            drawn = True
        for _, m in methods:
            if m.get("k") == "adaptive" and m.get("speedup_vs_baseline") is not None:
                ax.axhline(
                    m["speedup_vs_baseline"], color=color, linestyle="--", label=f"{family}, adaptive K"
                )
                drawn = True
    for name, m in report["methods"].items():
        if (
            m.get("kind") in ("hf-assisted", "hf-lookup", "hf-plain")
            and m.get("speedup_vs_baseline") is not None
        ):
            ax.axhline(m["speedup_vs_baseline"], color="gray", linestyle=":", linewidth=1)
            ax.annotate(
                name, (0.01, m["speedup_vs_baseline"]), xycoords=("axes fraction", "data"), fontsize=7
            )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("K (draft tokens per round)")
    ax.set_ylabel("speed-up vs baseline (tokens/s ratio)")
    ax.set_title("Speed-up against K")
    if not drawn:
        ax.text(0.5, 0.5, "no Tandem method with a speed-up to show", ha="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=8)
    return save(fig, path)


def plot_acceptance_by_category(report: dict, path: Path) -> Path:
    plt = pyplot()
    drafting = [(n, m) for n, m in report["methods"].items() if m.get("acceptance_rate") is not None]
    categories = list(next(iter(report["methods"].values()))["by_category"]) if report["methods"] else []
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(categories) + 2), 4.5))
    width = 0.8 / max(len(drafting), 1)
    for index, (name, m) in enumerate(drafting):
        values = [m["by_category"].get(c, {}).get("acceptance_rate") or 0.0 for c in categories]
        ax.bar([i + index * width for i in range(len(categories))], values, width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(categories))])
    ax.set_xticklabels(categories, rotation=30, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("acceptance rate (accepted / drafted)")
    ax.set_title("Acceptance by category")
    if drafting:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no method drafted", ha="center", transform=ax.transAxes)
    return save(fig, path)


def family_parameters(methods: list[tuple[str, dict]]) -> tuple[float | None, float | None, dict[int, float]]:
    """Mean alpha and c over a family's methods, and the target's verify cost t(n)/t(1) where measured."""
    alphas = [m["alpha"] for _, m in methods if m.get("alpha") is not None]
    costs = [
        m["draft_step_s"] / m["target_step_s"]
        for _, m in methods
        if m.get("draft_step_s") is not None and m.get("target_step_s")
    ]
    ratios: dict[int, list[float]] = {}
    for _, m in methods:
        seconds = {int(n): s for n, s in (m.get("verify_forward_s") or {}).items()}
        if seconds.get(1, 0) > 0:
            for n, s in seconds.items():
                ratios.setdefault(n, []).append(max(s / seconds[1], 1.0))
    verify = {n: sum(values) / len(values) for n, values in sorted(ratios.items())}
    alpha = sum(alphas) / len(alphas) if alphas else None
    c = sum(costs) / len(costs) if costs else (0.0 if alpha is not None else None)
    return alpha, c, verify


def interpolate(curve: dict[int, float], n: int) -> float | None:
    """curve(n), linear between measured sizes; None outside them (no extrapolation)."""
    if n in curve:
        return curve[n]
    lower = max((s for s in curve if s < n), default=None)
    upper = min((s for s in curve if s > n), default=None)
    if lower is None or upper is None:
        return None
    return curve[lower] + (curve[upper] - curve[lower]) * (n - lower) / (upper - lower)


def plot_theory(report: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    max_k = max([int(m["k"]) for m in report["methods"].values() if str(m.get("k", "")).isdigit()] + [8])
    ks = list(range(0, max_k + 1))
    drawn = False
    for index, family in enumerate(SWEEP_FAMILIES):
        methods = family_methods(report, family)
        alpha, c, verify = family_parameters(methods)
        if alpha is None:
            continue
        color = f"C{index}"
        label = f"{family}: E(K)/(1+Kc), a={alpha:.2f}, c={c:.2f}"
        ax.plot(ks, [theoretical_speedup(alpha, c, k) for k in ks], "-", color=color, label=label)
        aware = [(k, interpolate(verify, k + 1)) for k in ks]
        aware = [(k, verify_aware_speedup(alpha, c, k, v)) for k, v in aware if v]
        if aware:
            ax.plot(*zip(*aware, strict=True), ":", color=color, label=f"{family}: with measured verify cost")
        points = fixed_k_points(methods)
        if points:
            ax.plot(*zip(*points, strict=True), "o", color=color, label=f"{family}: measured")
        for _, m in methods:
            if m.get("k") == "adaptive" and m.get("mean_k") is not None and m.get("speedup_vs_baseline"):
                ax.plot(
                    m["mean_k"],
                    m["speedup_vs_baseline"],
                    "*",
                    markersize=12,
                    color=color,
                    label=f"{family}: adaptive (at mean K)",
                )
        drawn = True
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("K (draft tokens per round)")
    ax.set_ylabel("speed-up vs baseline")
    ax.set_title("Measured speed-up against theory")
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no drafting Tandem method measured", ha="center", transform=ax.transAxes)
    return save(fig, path)


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
