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
