"""Nothing a server sends reaches the terminal as a control: the real `tandem-cli chat --server` against
a fake server on 127.0.0.1 that puts escape sequences (title, OSC 52 clipboard, cursor movement, erase,
C1 controls, lone ESC, BEL, backspace, carriage return) in the model's name, stream chunks, a reply that
is not streamed, a stream's error and error bodies. Only newline and tab reach stdout and stderr."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from fake_openai_server import FakeServer

from engine.cli.terminal import visible

ROOT = Path(__file__).resolve().parents[1]
INSTALLED_CLI = Path(sys.executable).with_name("tandem-cli")
CLI = [str(INSTALLED_CLI)] if INSTALLED_CLI.exists() else [sys.executable, "-m", "engine.cli.main"]


def run_cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TANDEM_CREDENTIALS": "file"}
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, env=env, timeout=120)


def controls(data: bytes) -> list[str]:
    """The control characters in a terminal's bytes, but newline and tab; an ESC byte counts even
    inside a character that is not UTF-8."""
    found = ["ESC byte"] * data.count(b"\x1b")
    text = data.decode("utf-8", errors="replace")
    return found + [repr(c) for c in text if unicodedata.category(c) == "Cc" and c not in "\n\t"]


@pytest.fixture(scope="module")
def server():
    with FakeServer() as fake:
        yield fake


@pytest.mark.parametrize(
    "case, args, stdin",
    [
        ("escapes-stream", ("--message", "hi", "--stats"), b""),
        ("escapes-stream", ("--stats",), b"hi\n\n"),  # interactive: the title line names the model
        ("escapes-whole", ("--message", "hi"), b""),
        ("escapes-stream-error", ("--message", "hi"), b""),
        ("escapes-error", ("--message", "hi"), b""),
        ("models-error", ("--message", "hi"), b""),
    ],
)
def test_no_control_character_from_a_server_reaches_the_terminal(server, tmp_path, case, args, stdin):
    result = run_cli(
        "chat", "--server", f"{server.url}/{case}", "--db", str(tmp_path / "t.db"), *args, stdin=stdin
    )
    shown = result.stdout.decode() + result.stderr.decode()
    assert b"Traceback" not in result.stderr, result.stderr.decode()
    assert controls(result.stdout) == [] and controls(result.stderr) == [], shown
    if case in ("escapes-stream", "escapes-whole"):
        assert result.returncode == 0, shown
        # made visible, not dropped: the user sees that the server sent them
        assert "␛]52;c;ZWNobyBvd25lZA==␇" in shown and "plain\ttext\n" in shown and "safe␍EVIL" in shown
    else:
        assert "␛]52;c;ZXZpbA==␇" in shown
    if "--stats" in args:
        assert "drafter x␛]0;owned␇" in result.stderr.decode()


def test_visible_keeps_text_newlines_and_tabs_and_shows_every_other_control():
    every = "".join(chr(c) for c in range(0xA0))
    shown = visible(every)
    assert [c for c in shown if unicodedata.category(c) == "Cc"] == ["\t", "\n"]
    assert visible("a\r\nb\tc é 漢字 🙂") == "a\nb\tc é 漢字 🙂"
    assert visible("\x1b[2J\x9b1A\x7f") == "␛[2J<9B>1A␡"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_prompt_reading_is_one_line_on_a_terminal_and_nothing_in_a_log(monkeypatch):
    """The chat's progress while a long prompt is read: one stderr line rewritten in place (carriage
    returns only, no escape sequence) and blanked before the reply prints; nothing where stderr is not
    a terminal."""
    from engine.cli.terminal import TerminalPrinter
    from engine.events import PrefillProgress

    reports = [PrefillProgress(0, 1200, None, 1300), PrefillProgress(512, 1200, 3.2, 1300)]
    reports.append(PrefillProgress(1200, 1200, 0.0, 1300))
    terminal, log = _Terminal(), io.StringIO()
    for stream in (terminal, log):
        monkeypatch.setattr(sys, "stderr", stream)
        printer = TerminalPrinter(io.StringIO())
        for report in reports:
            printer(report)
    shown = terminal.getvalue()
    assert shown.split("\r")[1:] == [
        "[reading the prompt: 0 of 1,200 tokens]",
        "[reading the prompt: 512 of 1,200 tokens · about 3 s left]",
        " " * len("[reading the prompt: 512 of 1,200 tokens · about 3 s left]"),
        "",
    ]
    assert [c for c in shown if unicodedata.category(c) == "Cc"] == ["\r"] * 4
    assert log.getvalue() == ""
