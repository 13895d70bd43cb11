"""A disk that fills up while a reply streams: the reply stays in memory, the error names the cause,
and the reply is saved once space returns. Runs on a real full disk: a 2 MiB tmpfs in a private mount
namespace (unshare -rm), filled with a filler file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from engine.errors import DiskFullError
from engine.store.database import Store
from engine.store.streaming import ThrottledUpdater

disk = Path(sys.argv[1])
store = Store(disk / "t.db")
cid = store.create_conversation()
store.add_message(cid, "user", "tell me")
mid = store.begin_assistant(cid)
updater = ThrottledUpdater(store, mid, interval=0.05)
updater.append("before the disk filled. ")
assert updater.flush(timeout=60)
filler = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
for size in (65536, 4096, 512, 1):  # fill the disk to the last byte
    try:
        while True:
            os.write(filler, b"\0" * size)
    except OSError:
        pass
os.close(filler)
reply = "".join(f"piece {i} " for i in range(20000))  # far more than is left
updater.append(reply)
saved_while_full = updater.flush(timeout=10)
error = str(updater.error)
kept = updater.text
os.remove(disk / "filler")  # space returns
saved_after = updater.flush(timeout=60)
updater.finish("complete")
print(json.dumps({
    "saved_while_full": saved_while_full, "error": error, "kept": kept,
    "stored": store.get_message(mid).content, "status": store.get_message(mid).status,
    "integrity": store.db.conn.execute("PRAGMA integrity_check").fetchone()[0], "saved_after": saved_after,
}))
"""


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not _can_unshare(), reason="needs unshare -rm to mount a small tmpfs")
def test_a_full_disk_keeps_the_reply_and_saves_it_when_space_returns(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    setup = f'mount -t tmpfs -o size=2m tandem-full "{disk}"'
    result = subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            f'{setup} && exec "$0" "$@"',
            sys.executable,
            "-c",
            SCRIPT,
            str(disk),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.splitlines()[-1])
    expected = "before the disk filled. " + "".join(f"piece {i} " for i in range(20000))
    assert not outcome["saved_while_full"]
    assert "is full: free space and retry" in outcome["error"]
    assert outcome["kept"] == expected  # nothing dropped while the disk was full
    assert outcome["saved_after"]
    assert (outcome["stored"], outcome["status"], outcome["integrity"]) == (expected, "complete", "ok")


CREATE_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from engine.errors import DiskFullError
from engine.store.database import Store

disk = Path(sys.argv[1])
filler = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
for size in (65536, 4096, 512, 1):  # fill the disk to the last byte
    try:
        while True:
            os.write(filler, b"\0" * size)
    except OSError:
        pass
os.close(filler)
try:
    Store(disk / "new.db")
    error = None
except DiskFullError as exc:
    error = str(exc)
left = sorted(p.name for p in disk.iterdir())
os.remove(disk / "filler")  # space returns: the next start creates the database
store = Store(disk / "new.db")
cid = store.create_conversation()
print(json.dumps({"error": error, "left": left, "created": store.get_conversation(cid).id}))
"""


@pytest.mark.skipif(not _can_unshare(), reason="needs unshare -rm to mount a small tmpfs")
def test_a_database_created_on_a_full_disk_leaves_no_empty_file(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    setup = f'mount -t tmpfs -o size=2m tandem-full "{disk}"'
    command = [
        "unshare",
        "-rm",
        "sh",
        "-c",
        f'{setup} && exec "$0" "$@"',
        sys.executable,
        "-c",
        CREATE_SCRIPT,
    ]
    result = subprocess.run([*command, str(disk), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert "is full: free space and retry" in outcome["error"]
    assert outcome["left"] == ["filler"]  # no 0-byte new.db, -wal or -shm
    assert outcome["created"] == 1
