"""The crash soak: kill -9 of the terminal chat and of the app's writer path, RUNS times each.

    python tests/soak.py [RUNS] [--builtin] [--cli-runs N]        (make soak: 50 runs each, under nice)

Reports, per path, messages lost (goal 0), integrity_check (goal ok every time) and the largest loss
of streamed output (goal at most 0.5 s). Exits 1 when a goal is missed.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cli_crash  # noqa: E402
import test_store_crash as writer_crash  # noqa: E402

GOAL_S = 0.5


def soak_cli(folder: Path, runs: int, target) -> bool:
    results = []
    for seed in range(runs):
        results.append(cli_crash.run_once(folder, seed, target))
        r = results[-1]
        print(
            f"  cli run {seed}: lost {r.lost_chars} chars ({r.lost_s:.2f} s) {r.problems or ''}", flush=True
        )
    lost = sum(r.messages_lost for r in results)
    bad = sum(r.integrity != "ok" for r in results)
    worst = max(results, key=lambda r: r.lost_s)
    problems = [p for r in results for p in r.problems]
    print(
        f"CLI: {runs} kill -9 runs, messages lost {lost}, integrity_check not ok {bad}, "
        f"largest loss {worst.lost_s:.2f} s of output ({worst.lost_chars} chars), problems {len(problems)}"
    )
    return lost == 0 and bad == 0 and worst.lost_s <= GOAL_S and not problems


def soak_writer(folder: Path, runs: int) -> bool:
    rng = random.Random(7)
    db = folder / "writer.db"
    earlier: dict = {}
    results = []
    for run in range(runs):
        log = folder / f"writer-{run}.log"
        writer_crash._kill_one(db, log, run, rng.uniform(0, writer_crash.LONGEST_WAIT))
        results.append(writer_crash._check(db, log, run, earlier))
    lost = sum(r.messages_lost for r in results)
    problems = [p for r in results for p in r.problems]
    worst = max(results, key=lambda r: r.streamed_lost)
    # the writer produces pieces at a steady rate: characters per second of its output
    print(
        f"app writer path: {runs} kill -9 runs on one database, messages lost {lost}, problems {len(problems)}, "
        f"largest loss {worst.streamed_lost} chars (one interval of its output is about {worst.bound} chars)"
    )
    return lost == 0 and not problems and all(r.streamed_lost <= r.bound for r in results)


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    builtin = "--builtin" in sys.argv  # the built-in model instead of the tiny one: slower, same path
    cli_runs = int(sys.argv[sys.argv.index("--cli-runs") + 1]) if "--cli-runs" in sys.argv else runs
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tandem-soak-") as folder:
        ok_writer = soak_writer(Path(folder), runs)
        target = cli_crash.DEFAULT_TARGET if builtin else cli_crash.tiny_target(Path(folder))
        ok_cli = soak_cli(Path(folder), cli_runs, target)
    print(
        f"soak finished in {time.monotonic() - started:.0f} s: {'ok' if ok_writer and ok_cli else 'GOALS MISSED'}"
    )
    return 0 if ok_writer and ok_cli else 1


if __name__ == "__main__":
    sys.exit(main())
