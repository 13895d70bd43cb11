"""Is the speed-up figure true on a busy machine? Replies with no drafter and with `auto`, taken in
turns on the same prompts while a busy loop spins on every core, each with the figure the app shows
(`GenerationStats.speedup`) and its measured decode speed.

A true figure reads ×1.00 for every reply with no drafter, and for `auto` it agrees with what was
measured: its speed over the no-drafter replies' speed on the same prompts.

    python -m engine.bench.under_load --replies 10 --json under-load.json
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
from pathlib import Path


def spin() -> None:
    while True:
        pass


def busy_loops(count: int) -> list[multiprocessing.Process]:
    loops = [multiprocessing.Process(target=spin, daemon=True) for _ in range(count)]
    for loop in loops:
        loop.start()
    return loops


def geometric_mean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def reply(engine, drafter: str, question: str) -> dict:
    from engine.settings import SpeculationSettings

    engine.speculation = SpeculationSettings(drafter=drafter)
    finished = engine.respond([{"role": "user", "content": question}])
    stats = finished.stats
    return {
        "drafter": drafter,
        "shown": stats.speedup,
        "shown_is_estimate": stats.speedup_is_estimate,
        "decode_tokens_per_s": stats.decode_tokens_per_s,
        "tokens": list(finished.token_ids),
    }


def summary(pairs: list[tuple[dict, dict]]) -> dict:
    plain = [p for p, _ in pairs]
    drafted = [d for _, d in pairs]
    measured = geometric_mean([d["decode_tokens_per_s"] / p["decode_tokens_per_s"] for p, d in pairs])
    shown = geometric_mean([d["shown"] for d in drafted])
    return {
        "none_shown": [round(p["shown"], 3) for p in plain],
        "none_within_5_percent": all(abs(p["shown"] - 1) <= 0.05 for p in plain),
        "auto_shown_geometric_mean": round(shown, 3),
        "auto_measured_ratio": round(measured, 3),
        "auto_shown_over_measured": round(shown / measured, 3),
        "auto_within_10_percent": abs(shown / measured - 1) <= 0.10,
        "identical_replies": all(p["tokens"] == d["tokens"] for p, d in pairs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=10, help="prompts; each gets a reply of each kind")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy loops (one per core)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from engine.bench.prompts import default_prompts_path, load_prompts
    from engine.models.builtin import DEFAULT_TARGET
    from engine.models.pair import load_pair
    from engine.session import ChatEngine
    from engine.settings import SamplingSettings

    target, draft = load_pair(DEFAULT_TARGET, None)
    engine = ChatEngine(
        target,
        draft,
        sampling=SamplingSettings(temperature=0.0, max_new_tokens=args.max_tokens),
        remember_drafters=True,
    )
    engine.prepare()
    questions = [p.turns[0] for p in load_prompts(default_prompts_path())][: args.replies]
    loops = busy_loops(args.busy)
    pairs = []
    try:
        for n, question in enumerate(questions):
            order = ("none", "auto") if n % 2 == 0 else ("auto", "none")
            done = {drafter: reply(engine, drafter, question) for drafter in order}
            pairs.append((done["none"], done["auto"]))
            print(
                f"{n + 1}/{len(questions)}: none ×{done['none']['shown']:.2f} "
                f"{done['none']['decode_tokens_per_s']:.1f} tok/s · auto ×{done['auto']['shown']:.2f} "
                f"{done['auto']['decode_tokens_per_s']:.1f} tok/s",
                flush=True,
            )
    finally:
        for loop in loops:
            loop.terminate()
    result = {"busy_loops": args.busy, "replies": len(pairs), **summary(pairs)}
    print(json.dumps(result, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
