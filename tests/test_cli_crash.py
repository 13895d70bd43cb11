"""kill -9 of `tandem-cli chat --db` mid-reply: no message lost, the database intact, and the reply
stored as a prefix of what was printed, committed while it streamed. How much of the last moments a
kill loses is printed, not asserted: on a busy machine the saver's thread may wake late, and the rule
it keeps (text uncommitted for less than the interval, by its own clock) is checked in tests/test_store.py."""

from __future__ import annotations

import signal

import pytest
from cli_crash import CLI, run_once, tiny_target

from engine.store.database import Store

pytestmark = [
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL"),
    pytest.mark.skipif(not CLI.exists(), reason="needs the installed tandem-cli (make venv)"),
]


def test_sigkill_of_the_terminal_chat_keeps_every_message_and_all_but_the_last_half_second(tmp_path, capsys):
    result = run_once(tmp_path, seed=1, target=tiny_target(tmp_path))
    with capsys.disabled():
        print(
            f"\nCLI crash: printed {result.printed_chars} chars, stored {result.stored_chars}, "
            f"lost {result.lost_chars} chars = the last {result.lost_s:.2f} s of output"
        )
    assert not result.problems, result.problems
    assert result.messages_lost == 0 and result.integrity == "ok"
    assert result.stored_chars > 0  # committed while it streamed, before the kill: not vacuous
    with Store(tmp_path / "cli-1.db") as store:  # its writer is gone: the reply is recovered
        assert store.recovered == 1
        assert store.thread(1)[-1].status == "interrupted"


def test_ctrl_c_of_the_terminal_chat_saves_the_reply_as_printed(tmp_path):
    result = run_once(tmp_path, seed=2, target=tiny_target(tmp_path), sig=signal.SIGINT)
    assert not result.problems, result.problems  # exit 130, the reply 'cancelled'
    assert result.messages_lost == 0 and result.integrity == "ok"
    # everything printed was saved, but for the piece Ctrl+C may land between printing and saving
    assert result.stored_chars > 0 and result.lost_chars <= 64
