"""Kill `tandem-cli chat --db` with SIGKILL while it streams a reply, then check what the store kept.

run_once() starts the installed command (on a tiny random model by default: the same path, quicker), reads its stdout as it arrives (the
reply, printed piece by piece), kills it a while into the reply, and compares the database with what
was printed. test_cli_crash.py runs it once per `make test`; soak.py runs it many times.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / ".venv" / "bin" / "tandem-cli"
DEFAULT_TARGET = "builtin:smollm2-135m-instruct"
INTERVAL = 0.5  # ConversationRecorder.UPDATE_INTERVAL_S
MIN_PRINTED = 200  # bytes of reply printed before the random wait before the kill begins
PROMPTS = [
    "Write a long story about a lighthouse keeper and a storm.",
    "Explain in detail how a bicycle works, part by part.",
    "Describe a walk through a busy market, with every smell and sound.",
    "Tell me a long tale about a dragon who learns to bake bread.",
]


@dataclass
class CrashResult:
    seed: int
    printed_chars: int = 0
    stored_chars: int = 0
    lost_chars: int = 0
    lost_s: float = 0.0  # how long before the kill the first lost character was printed
    messages_lost: int = 0
    integrity: str = ""
    problems: list[str] = field(default_factory=list)


def _reader(stream, arrivals: list[tuple[float, bytes]]) -> None:
    fd = stream.fileno()
    while True:
        data = os.read(fd, 4096)
        if not data:
            return
        arrivals.append((time.monotonic(), data))


def tiny_target(folder: Path) -> Path:
    """A tiny random model with the built-in tokenizer: it loads in a second and never stops talking."""
    from conftest import build_tiny_llama
    from transformers import AutoTokenizer

    from engine.models.builtin import DEFAULT_TARGET, ensure_builtin

    target = folder / "tiny-target"
    if not (target / "config.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(str(ensure_builtin(DEFAULT_TARGET)))
        model = build_tiny_llama(tokenizer, seed=11, layers=4, hidden=128)
        model.config.max_position_embeddings = 8192  # room for a long reply
        model.save_pretrained(str(target))
        tokenizer.save_pretrained(str(target))
    return target


def run_once(
    folder: Path,
    seed: int,
    target: str | Path,
    kill_after_s: tuple[float, float] = (1.0, 3.0),
    sig: int = signal.SIGKILL,
) -> CrashResult:
    """One run: start, wait for MIN_PRINTED bytes of reply and a random time in `kill_after_s`, kill -9, check."""
    rng = random.Random(seed)
    db = folder / f"cli-{seed}.db"
    prompt = PROMPTS[seed % len(PROMPTS)]
    command = [str(CLI), "chat", "--target", str(target), "--draft", "none", "--db", str(db)]
    command += ["--max-new-tokens", "6000", "--message", prompt]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    errors = (folder / f"cli-{seed}.stderr").open("wb")
    # Ctrl+C as a terminal sends it: a run started from a background job inherits SIGINT ignored, and
    # Python never installs its KeyboardInterrupt handler then
    restore = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if sig == signal.SIGINT else None
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=errors, env=env, cwd=folder, preexec_fn=restore
    )
    arrivals: list[tuple[float, bytes]] = []
    reader = threading.Thread(target=_reader, args=(process.stdout, arrivals), daemon=True)
    reader.start()
    result = CrashResult(seed)
    wait = rng.uniform(*kill_after_s)
    try:
        deadline = time.monotonic() + 600
        while sum(len(data) for _, data in arrivals) < MIN_PRINTED:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (folder / f"cli-{seed}.stderr").read_bytes()[-400:].decode("utf-8", "replace")
                printed = sum(len(data) for _, data in arrivals)
                result.problems.append(f"{printed} bytes printed, then exit {process.returncode}: {tail}")
                return result
            time.sleep(0.01)
        # the reply's first commit, however late a busy machine makes it: a kill before it would
        # leave nothing stored to compare (the commit's timing is tests/test_store.py's to check)
        while not stored_reply(db) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(wait)
    finally:
        killed_at = time.monotonic()
        process.send_signal(sig)  # SIGINT is Ctrl+C: the reply is saved as 'cancelled', exit 130
        process.wait()
        reader.join(timeout=30)
        errors.close()
    if process.returncode != (130 if sig == signal.SIGINT else -sig):
        result.problems.append(f"the reply ended before the kill (exit {process.returncode})")

    printed = b"".join(data for _, data in arrivals).decode("utf-8", "replace")
    result.printed_chars = len(printed)
    conn = sqlite3.connect(db)
    try:
        result.integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        rows = conn.execute("SELECT role, content, status FROM messages ORDER BY id").fetchall()
    finally:
        conn.close()
    if len(rows) != 2 or rows[0] != ("user", prompt, "complete"):
        result.messages_lost = 2 - len(rows)
        result.problems.append(f"stored rows {rows!r:.200}")
        return result
    _, content, status = rows[1]
    if status != ("cancelled" if sig == signal.SIGINT else "streaming"):
        result.problems.append(f"reply status {status!r}")
    count_loss(result, printed, content, arrivals, killed_at)
    return result


def stored_reply(db: Path) -> str:
    """The streaming reply as committed so far ("" before its first commit)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute("SELECT content FROM messages WHERE role = 'assistant'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return ""
    return row[0] if row and row[0] else ""


def count_loss(
    result: CrashResult, printed: str, content: str, arrivals: list[tuple[float, bytes]], killed_at: float
) -> None:
    """Compares the stored reply with what was printed: characters lost, and how long before the
    kill the first lost one was printed (the arrivals are walked until the stored text is covered)."""
    if not printed.startswith(content):
        result.problems.append("the stored reply is not a prefix of the printed one")
    result.stored_chars = len(content)
    result.lost_chars = len(printed) - len(content)
    seen = 0
    for at, data in arrivals:
        seen += len(data.decode("utf-8", "replace"))
        if seen > len(content):
            result.lost_s = max(0.0, killed_at - at)
            break


def run_mid_load(
    folder: Path, seed: int, target: str | Path, db: Path, longest_s: float = 3.0
) -> CrashResult:
    """kill -9 a random 0..longest_s s after the start, while it opens `db` and loads the model.

    `db` already holds conversations: they must come through whole (a reply left 'streaming' by an earlier
    kill may be recovered to 'interrupted' when the store is opened; its text must not change).
    """
    rng = random.Random(seed)
    result = CrashResult(seed)

    def rows() -> list[tuple]:
        conn = sqlite3.connect(db)
        try:
            result.integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
            return conn.execute("SELECT id, role, content FROM messages ORDER BY id").fetchall()
        finally:
            conn.close()

    before = rows()
    command = [str(CLI), "chat", "--target", str(target), "--draft", "none", "--db", str(db)]
    command += ["--max-new-tokens", "6000", "--message", PROMPTS[seed % len(PROMPTS)]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=folder
    )
    time.sleep(rng.uniform(0.0, longest_s))
    process.send_signal(signal.SIGKILL)
    process.wait()
    after = rows()
    kept = after[: len(before)]
    result.messages_lost = sum(1 for row in before if row not in kept)
    if kept != before:
        result.problems.append("an earlier message changed")
    if len(after) > len(before) + 2 or (len(after) > len(before) and after[len(before)][1] != "user"):
        result.problems.append(f"unexpected new rows {after[len(before) :]!r:.200}")
    return result
