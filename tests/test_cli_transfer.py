"""`tandem-cli export` and `tandem-cli import`, run as the installed command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.store.database import Store

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("tandem-cli")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "engine.cli.main"]
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "chats.db"
    with Store(path) as store:
        first = store.create_conversation("Boiling eggs", system_prompt="Be brief.")
        store.add_message(first, "user", "How long?")
        store.add_message(first, "assistant", "About **9 minutes**.", stats={"generated_tokens": 5})
        second = store.create_conversation("Decoding")
        store.add_message(second, "user", "What is a drafter?")
    return path


def test_export_markdown_of_one_conversation(db, tmp_path):
    out = tmp_path / "eggs.md"
    done = cli("export", "--db", str(db), "--format", "markdown", "--out", str(out), "--conversation", "1")
    assert done.returncode == 0, done.stderr
    assert "Exported 1 conversation" in done.stdout
    text = out.read_text()
    assert text.startswith("# Boiling eggs") and "About **9 minutes**." and "Be brief." in text
    assert "Decoding" not in text


def test_export_json_then_import_into_another_database(db, tmp_path):
    out = tmp_path / "all.json"
    done = cli("export", "--db", str(db), "--format", "json", "--out", str(out))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["format"] == "tandem-conversations" and len(data["conversations"]) == 2

    other = tmp_path / "other.db"
    done = cli("import", "--db", str(other), str(out))
    assert done.returncode == 0, done.stderr
    assert "Imported 2 conversations" in done.stdout
    with Store(other) as store:
        titles = sorted(c.title for c in store.list_conversations())
        assert titles == ["Boiling eggs", "Decoding"]
        eggs = next(c for c in store.list_conversations() if c.title == "Boiling eggs")
        assert [m.content for m in store.thread(eggs.id)] == ["How long?", "About **9 minutes**."]


def test_bad_input_gets_one_line_and_exit_2(db, tmp_path):
    missing = cli("export", "--db", str(tmp_path / "nope.db"), "--out", str(tmp_path / "x.json"))
    assert missing.returncode == 2 and "no conversation database" in missing.stderr
    assert "Traceback" not in missing.stderr and not (tmp_path / "nope.db").exists()

    unknown = cli("export", "--db", str(db), "--out", str(tmp_path / "x.json"), "--conversation", "99")
    assert unknown.returncode == 2 and "No conversation 99" in unknown.stderr

    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    bad = cli("import", "--db", str(db), str(junk))
    assert bad.returncode == 2 and "not a Tandem conversation export" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    with Store(db) as store:
        assert len(store.list_conversations()) == 2  # nothing half-imported

    nowhere = cli("export", "--db", str(db), "--out", str(tmp_path / "no" / "such" / "x.md"))
    assert nowhere.returncode == 2 and "does not exist" in nowhere.stderr
