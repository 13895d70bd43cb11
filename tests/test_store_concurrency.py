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


RUN = """
import sys, time
from pathlib import Path
from engine.store.database import Store
db, started, count = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
with Store(db) as store:
    cid = store.create_conversation("run")
    for i in range(count):
        with store.transaction() as d:
            d.execute("INSERT INTO settings (key, value) VALUES (?, '0')", (f"run {i}",))
            time.sleep(0.01)  # a write that holds the lock as a slow disk's sync would
        started.touch()
"""
ONE_WRITE = """
import sys, time
from pathlib import Path
from engine.store.database import Store
db, started = sys.argv[1], Path(sys.argv[2])
while not started.exists():
    time.sleep(0.001)
with Store(db) as store:
    with store.transaction() as d:
        d.execute("INSERT INTO settings (key, value) VALUES ('one write', '0')")
"""


def test_a_writer_gets_in_during_another_process_run_of_short_writes(tmp_path):
    """SQLite's own busy handler sleeps up to 100 ms between tries and so missed the short gaps
    between the run's writes, waiting out the whole run; polling every millisecond gets in."""
    from engine.store.database import Store

    db, started, count = tmp_path / "run.db", tmp_path / "started", 300
    Store(db).close()
    run = subprocess.Popen([sys.executable, "-c", RUN, str(db), str(started), str(count)], cwd=ROOT)
    one = subprocess.Popen([sys.executable, "-c", ONE_WRITE, str(db), str(started)], cwd=ROOT)
    assert [run.wait(timeout=600), one.wait(timeout=600)] == [0, 0]
    conn = sqlite3.connect(db)
    try:
        keys = [key for (key,) in conn.execute("SELECT key FROM settings ORDER BY rowid")]
    finally:
        conn.close()
    assert len(keys) == count + 1
    assert keys.index("one write") < count, "the single write waited for the whole run"
