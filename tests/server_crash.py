"""Kill `tandem-cli serve` with SIGKILL while `tandem-cli chat --server URL --db` streams from it, or while
it is still loading, then check what the chat's database kept.

All runs of a soak share one database, so every run also checks that the conversations of the earlier
runs are intact. soak.py runs it many times; test_server.py holds the one-run test of `make test`.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

from cli_crash import CLI, MIN_PRINTED, PROMPTS, CrashResult, _reader, count_loss

START_TIMEOUT_S = 300
LONGEST_LOAD_S = 3.0  # a mid-load kill comes 0..LONGEST_LOAD_S s after the server was started


def _rows(db: Path) -> tuple[str, list[tuple]]:
    if not db.exists():
        return "ok", []
    conn = sqlite3.connect(db)
    try:
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        rows = conn.execute("SELECT id, role, content, status FROM messages ORDER BY id").fetchall()
    finally:
        conn.close()
    return integrity, rows


def _start_server(folder: Path, seed: int, target: str | Path) -> tuple[subprocess.Popen, list[str]]:
    command = [str(CLI), "serve", "--target", str(target), "--draft", "none", "--port", "0"]
    command += ["--max-new-tokens", "6000"]
    stderr = (folder / f"server-{seed}.stderr").open("wb")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=folder, text=True)
    stderr.close()
    found: list[str] = []

    def read() -> None:
        for line in server.stdout:
            if line.startswith("Listening on ") and not found:
                found.append(line.split()[-1])

    threading.Thread(target=read, daemon=True).start()
    return server, found


def _kill(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait()


def run_mid_stream(folder: Path, seed: int, target: str | Path, db: Path) -> CrashResult:
    """The server dies a random 0.5..2 s after the chat printed MIN_PRINTED bytes of the reply."""
    rng = random.Random(seed)
    result = CrashResult(seed)
    _, before = _rows(db)
    server, found = _start_server(folder, seed, target)
    chat = None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not found:
            if server.poll() is not None or time.monotonic() > deadline:
                result.problems.append(f"the server did not start (exit {server.returncode})")
                return result
            time.sleep(0.02)
        prompt = PROMPTS[seed % len(PROMPTS)]
        command = [str(CLI), "chat", "--server", found[0], "--db", str(db), "--message", prompt]
        errors = (folder / f"chat-{seed}.stderr").open("wb")
        chat = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, cwd=folder)
        errors.close()
        arrivals: list[tuple[float, bytes]] = []
        reader = threading.Thread(target=_reader, args=(chat.stdout, arrivals), daemon=True)
        reader.start()
        while sum(len(data) for _, data in arrivals) < MIN_PRINTED:
            if chat.poll() is not None or time.monotonic() > deadline:
                result.problems.append(f"the chat ended before the kill (exit {chat.returncode})")
                return result
            time.sleep(0.01)
        time.sleep(rng.uniform(0.5, 2.0))
        killed_at = time.monotonic()
        _kill(server)
        chat.wait(120)
        reader.join(timeout=30)
    finally:
        _kill(server)
        if chat is not None and chat.poll() is None:
            chat.kill()
            chat.wait()
            result.problems.append("the chat did not exit after the server died")
    warning = (folder / f"chat-{seed}.stderr").read_text("utf-8", "replace")
    if chat.returncode != 0 or "[interrupted]" not in warning:
        result.problems.append(f"chat exit {chat.returncode}, stderr {warning[-300:]!r}")
    # the chat ends the interrupted reply with a newline of its own
    printed = b"".join(data for _, data in arrivals).decode("utf-8", "replace").removesuffix("\n")
    result.printed_chars = len(printed)
    result.integrity, rows = _rows(db)
    kept = [row for row in rows if row[0] <= (before[-1][0] if before else 0)]
    result.messages_lost = len(before) - len(kept) + max(0, 2 - (len(rows) - len(kept)))
    if kept != before:
        result.problems.append("an earlier conversation changed")
    new = rows[len(kept) :]
    if [(role, status) for _, role, _, status in new] != [("user", "complete"), ("assistant", "interrupted")]:
        result.problems.append(f"new rows {new!r:.200}")
        return result
    count_loss(result, printed, new[1][2], arrivals, killed_at)
    return result


def run_mid_load(folder: Path, seed: int, target: str | Path, db: Path) -> CrashResult:
    """The server dies while loading; a chat sent to it then says so in one line and stores nothing."""
    rng = random.Random(seed)
    result = CrashResult(seed)
    integrity, before = _rows(db)
    server, found = _start_server(folder, seed, target)
    time.sleep(rng.uniform(0.0, LONGEST_LOAD_S))
    url = found[0] if found else None
    _kill(server)
    if url is None:  # killed before it listened: its port is unknown, ask a port nobody holds
        url = "http://127.0.0.1:9"
    command = [str(CLI), "chat", "--server", url, "--db", str(db), "--message", PROMPTS[0]]
    answer = subprocess.run(command, capture_output=True, text=True, cwd=folder, timeout=120)
    lines = [line for line in answer.stderr.splitlines() if line.strip()]
    if answer.returncode != 2 or len(lines) != 1 or "Traceback" in answer.stderr:
        result.problems.append(f"chat exit {answer.returncode}, stderr {answer.stderr[-300:]!r}")
    result.integrity, rows = _rows(db)
    result.messages_lost = max(0, len(before) - len(rows))
    if rows != before:
        result.problems.append("the database changed")
    return result
