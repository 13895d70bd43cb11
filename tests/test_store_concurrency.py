"""Two processes writing one database at the same moment: both finish and nothing is lost.

Each writer adds 300 conversations (a user message and a reply each, the reply streamed through a
'streaming' row). Without BEGIN IMMEDIATE the second writer failed at once with "in use by another
program" whenever its read turned into a write while the other wrote.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONVERSATIONS = 300
WRITER = """
import sys, time
from pathlib import Path
from engine.store.database import Store
db, name, start, count = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
while not start.exists():  # both begin together
    time.sleep(0.001)
with Store(db) as store:
    for i in range(count):
        cid = store.create_conversation(f"{name} {i}")
        store.add_message(cid, "user", f"{name} question {i}")
        mid = store.begin_assistant(cid)
        store.update_streaming(mid, f"{name} half")
        store.finish_message(mid, "complete", text=f"{name} answer {i}")
"""


def test_two_processes_writing_300_conversations_each_both_finish(tmp_path):
    db, start = tmp_path / "shared.db", tmp_path / "go"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db), name, str(start), str(CONVERSATIONS)],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("first", "second")
    ]
    start.touch()
    errors = [writer.communicate(timeout=600)[1] for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0], errors
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        for name in ("first", "second"):
            titles = conn.execute(
                "SELECT count(*) FROM conversations WHERE title LIKE ?", (f"{name} %",)
            ).fetchone()
            answers = conn.execute(
                "SELECT count(*) FROM messages WHERE content LIKE ? AND status = 'complete'",
                (f"{name} answer %",),
            ).fetchone()
            assert titles[0] == CONVERSATIONS and answers[0] == CONVERSATIONS
        assert conn.execute("SELECT count(*) FROM messages WHERE status != 'complete'").fetchone()[0] == 0
    finally:
        conn.close()


def test_a_waiting_writer_tries_every_millisecond_and_gets_into_a_short_gap(tmp_path):
    """SQLite's own busy handler sleeps up to 100 ms between tries and so missed the short gaps
    between another process's run of short writes, waiting out the whole run. The waiting writer tries
    with no busy handler and again after WRITE_POLL_S: here the other writer lets go during one of
    those waits (the waits are the test's, so the gap is where it is on any machine) and the very
    next try gets in."""
    from engine.store.database import Store
    from engine.store.schema import WRITE_POLL_S, begin_immediate

    db = tmp_path / "gap.db"
    Store(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    waiter = sqlite3.connect(db, isolation_level=None, timeout=5)
    try:
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("INSERT INTO settings (key, value) VALUES ('held', '0')")
        waits: list[float] = []

        def wait(seconds: float) -> None:
            waits.append(seconds)
            if len(waits) == 3:
                holder.execute("COMMIT")  # the gap between two of the other writer's writes

        begin_immediate(waiter, sleep=wait)
        assert (
            waits == [WRITE_POLL_S] * 3 and WRITE_POLL_S <= 0.002
        )  # three tries refused at once; the first in the gap gets in
        assert waiter.in_transaction
        with pytest.raises(sqlite3.OperationalError):  # the gap is closed: the waiter holds the lock
            holder.execute("BEGIN IMMEDIATE")
        waiter.execute("INSERT INTO settings (key, value) VALUES ('one write', '0')")
        waiter.execute("COMMIT")
        assert waiter.execute("PRAGMA busy_timeout").fetchone()[0] == 5000  # the handler is back
    finally:
        holder.close()
        waiter.close()


def test_a_writer_still_refused_at_its_busy_timeout_gets_the_busy_error(tmp_path):
    from engine.store.database import Store
    from engine.store.schema import begin_immediate

    db = tmp_path / "held.db"
    Store(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    waiter = sqlite3.connect(db, isolation_level=None, timeout=0.05)
    try:
        holder.execute("BEGIN IMMEDIATE")
        waits: list[float] = []
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            begin_immediate(waiter, sleep=waits.append)
        assert waits and not waiter.in_transaction
    finally:
        holder.close()
        waiter.close()
