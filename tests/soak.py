"""The crash soak: kill -9 of the terminal chat, of the app's writer path and of the server, RUNS times each.

    python tests/soak.py [RUNS] [--builtin] [--cli-runs N] [--only cli|writer|server]
                                                             (make soak: 50 runs each, under nice)

The CLI and the server are killed mid-stream in four runs of five and mid-load in the fifth.

Reports, per path, messages lost (goal 0), integrity_check (goal ok every time) and the largest loss
of streamed output (goal at most 0.5 s). Exits 1 when a goal is missed.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from pathlib import Path

# The commands it kills would otherwise start a compiling helper each (ChatEngine.optimize_in_background),
# which is not what the soak measures; as in the test suite.
os.environ.setdefault("TANDEM_COMPILE", "off")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cli_crash  # noqa: E402
import server_crash  # noqa: E402
import test_store_crash as writer_crash  # noqa: E402

GOAL_S = 0.5


def summarize(path: str, streams: list, loads: list) -> bool:
    """Prints one path's figures (CrashResults of mid-stream and mid-load kills); True when every goal is met."""
    results = streams + loads
    lost = sum(r.messages_lost for r in results)
    bad = sum(r.integrity != "ok" for r in results)
    worst = max(streams, key=lambda r: r.lost_s)
    problems = [p for r in results for p in r.problems]
    print(
        f"{path}: {len(results)} kill -9 runs ({len(streams)} mid-stream, {len(loads)} mid-load), "
        f"messages lost {lost}, integrity_check not ok {bad}, "
        f"largest loss {worst.lost_s:.2f} s of output ({worst.lost_chars} chars), problems {len(problems)}"
    )
    return lost == 0 and bad == 0 and worst.lost_s <= GOAL_S and not problems


def soak_cli(folder: Path, runs: int, target) -> bool:
    streams, loads = [], []
    for seed in range(runs):
        if seed % 5 == 4:  # mid-load, on the database the run before left behind
            loads.append(cli_crash.run_mid_load(folder, seed, target, folder / f"cli-{seed - 1}.db"))
            print(f"  cli run {seed}: mid-load {loads[-1].problems or ''}", flush=True)
            continue
        streams.append(cli_crash.run_once(folder, seed, target))
        r = streams[-1]
        print(
            f"  cli run {seed}: lost {r.lost_chars} chars ({r.lost_s:.2f} s) {r.problems or ''}", flush=True
        )
    return summarize("CLI", streams, loads)


def soak_server(folder: Path, runs: int, target) -> bool:
    db = folder / "server-chats.db"  # one database for every run: earlier conversations must survive
    streams, loads = [], []
    for seed in range(runs):
        mid_load = seed % 5 == 4
        run = server_crash.run_mid_load if mid_load else server_crash.run_mid_stream
        r = run(folder, seed, target, db)
        (loads if mid_load else streams).append(r)
        what = "mid-load" if mid_load else f"lost {r.lost_chars} chars ({r.lost_s:.2f} s)"
        print(f"  server run {seed}: {what} {r.problems or ''}", flush=True)
    return summarize("server", streams, loads)


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
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    ok = True
    with tempfile.TemporaryDirectory(prefix="tandem-soak-") as folder:
        target = cli_crash.DEFAULT_TARGET if builtin else cli_crash.tiny_target(Path(folder))
        if only in (None, "writer"):
            ok &= soak_writer(Path(folder), runs)
        if only in (None, "cli"):
            ok &= soak_cli(Path(folder), cli_runs, target)
        if only in (None, "server"):
            ok &= soak_server(Path(folder), runs, target)
    print(f"soak finished in {time.monotonic() - started:.0f} s: {'ok' if ok else 'GOALS MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
