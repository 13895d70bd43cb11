"""What the terminal chat checks before it loads a model, through the real `tandem-cli chat`: a closed
standard input and a database it cannot write are one line each, reported before the model (a target
that does not exist would otherwise be the error); the end of input ends a chat cleanly; and a
--message is in the database before the model is ready, so kill -9 during the load loses nothing."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from test_terminal_safety import CLI, ROOT

from engine.store.database import Store

NO_MODEL = ("--target", "/nonexistent/tandem-model", "--draft", "none")
OTHER_USER = 65534


def cli_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    assert b"Traceback" not in result.stderr, result.stderr.decode()
    return [line for line in result.stderr.decode().splitlines() if line.strip()]


def test_a_closed_stdin_is_one_line_before_the_model_loads(tmp_path):
    command = ["sh", "-c", 'exec "$0" "$@" <&-', *CLI, "chat", *NO_MODEL, "--db", str(tmp_path / "t.db")]
    result = subprocess.run(command, capture_output=True, env=cli_env(), timeout=120)
    lines = error_lines(result)
    assert result.returncode == 2 and lines == [
        "tandem: Standard input is closed: give the message with --message, or start the chat with its "
        "input open."
    ]


def test_the_end_of_input_ends_a_chat_cleanly(tmp_path):
    from cli_crash import tiny_target

    command = [*CLI, "chat", "--target", str(tiny_target(tmp_path)), "--draft", "none"]
    result = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, env=cli_env(), timeout=600
    )
    error_lines(result)
    assert result.returncode == 0, result.stderr.decode()


def _as_another_user(command: list[str]) -> list[str]:
    """Root writes a chmod 444 file all the same: run as another user where this runs as root."""
    if os.geteuid() != 0:
        return command
    return ["setpriv", f"--reuid={OTHER_USER}", f"--regid={OTHER_USER}", "--clear-groups", *command]


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root needs setpriv")
@pytest.mark.parametrize("args, stdin", [(("--message", "hi"), b""), ((), b"hi\n")])
def test_a_read_only_db_is_one_line_before_the_model_loads(args, stdin):
    with tempfile.TemporaryDirectory(prefix="tandem-ro-db-") as name:  # under /tmp: any user may enter
        folder = Path(name)
        folder.chmod(0o777)
        db = folder / "t.db"
        Store(db).close()
        for path in folder.iterdir():
            if path != db:
                path.unlink()  # the -wal and -shm files are made by the user that opens it
        if os.geteuid() == 0:
            os.chown(db, OTHER_USER, OTHER_USER)
        db.chmod(0o444)
        result = _run_read_only(db, args, stdin)
    lines = error_lines(result)
    assert result.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"tandem: {db} cannot be written to."), lines


def _run_read_only(db: Path, args: tuple, stdin: bytes) -> subprocess.CompletedProcess:
    command = _as_another_user([*CLI, "chat", *NO_MODEL, "--db", str(db), *args])
    return subprocess.run(
        command, input=stdin, capture_output=True, env=cli_env(), timeout=120, cwd=db.parent
    )


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_message_is_stored_before_the_model_loads_so_kill_9_during_the_load_loses_nothing(tmp_path):
    db = tmp_path / "t.db"
    message = "Keep me: sent just before the kill."
    command = [*CLI, "chat", "--draft", "none", "--db", str(db), "--message", message]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    try:
        rows: list = []
        deadline = time.monotonic() + 300
        while not rows and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                    rows = conn.execute("SELECT role FROM messages").fetchall()
            except sqlite3.Error:
                pass  # not created yet
    finally:
        process.kill()
        out, err = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL, err.decode()
    assert out == b""  # killed before any reply was printed
    with Store(db) as store:
        (conversation,) = store.list_conversations()
        thread = store.thread(conversation.id)
        integrity = store.db.conn.execute("PRAGMA integrity_check").fetchone()[0]
    # the message, and nothing after it: the kill came before the model was ready to answer
    assert [(m.role, m.content, m.status) for m in thread] == [("user", message, "complete")]
    assert integrity == "ok"
