"""Every bad input in the catalogue (bad_inputs.py), run through the installed `tandem-cli` the way a
user runs it: one readable `tandem:` line on stderr, a non-zero exit, no traceback, and the database
the command pointed at left as it was."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import pytest
from bad_inputs import CASES, CLI, ROOT, Case, Workspace, can_wrap, fingerprint, run_case

pytestmark = pytest.mark.skipif(not CLI.exists(), reason="needs the installed tandem-cli (make venv)")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, builtin_tokenizer):
    workspace = Workspace(tmp_path_factory.mktemp("bad-inputs"), builtin_tokenizer)
    yield workspace
    workspace.close()


HOLDER = """
import sys
from engine.store.database import Store
store = Store(sys.argv[1])
store.acquire_instance_lock()
print("held", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gets_one_readable_line(case: Case, workspace: Workspace):
    if case.wrap and not can_wrap(case):
        pytest.skip("needs unshare -rm (a read-only or full disk) or setpriv (another user)")
    workspace.fresh_databases()
    db = getattr(workspace, case.db) if case.db else None
    before = fingerprint(db) if db else None
    holder = None
    if case.db == "held_db":
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(db)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert holder.stdout.readline() == "held\n"
    try:
        result = run_case(case, workspace)
    finally:
        if holder is not None:
            holder.communicate("\n", timeout=60)
    stderr = result.stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("tandem:")]
    assert len(lines) == 1, stderr
    assert re.search(case.error, lines[0], re.IGNORECASE), lines[0]
    assert result.returncode == case.exit_code, (result.returncode, stderr)
    if db is not None:
        assert fingerprint(db) == before


def test_a_second_tandem_on_the_same_database_is_told_it_is_in_use(tmp_path):
    """In one process too: a second claim fails while the first holds it, and succeeds after."""
    from engine.errors import DatabaseLockedError
    from engine.store.database import Store

    path = tmp_path / "t.db"
    with Store(path) as first, Store(path) as second:
        first.acquire_instance_lock()
        with pytest.raises(DatabaseLockedError, match="in use by another Tandem"):
            second.acquire_instance_lock()
        first.close()
        with second.instance_lock():
            pass


def test_a_lone_surrogate_is_refused_with_a_readable_error(tmp_path):
    from engine.errors import InvalidTextError
    from engine.store.database import Store

    with Store(tmp_path / "t.db") as store:
        cid = store.create_conversation()
        with pytest.raises(InvalidTextError, match="U\\+D800 at position 2"):
            store.add_message(cid, "user", "ab\ud800c")
        assert store.thread(cid) == []


def test_cancelling_during_prefill_stops_within_one_chunk(make_tiny):
    """The cancel flag is read between prefill chunks: set during the first, no second one runs."""
    from engine.decoding import speculative
    from engine.runtime.eager import ModelRunner
    from engine.session import ChatEngine

    class CountingRunner(ModelRunner):
        prefills = 0

        def prefill(self, ids):
            CountingRunner.prefills += 1
            cancel.set()  # the user presses Stop while this chunk runs
            return super().prefill(ids)

    engine = ChatEngine(make_tiny(seed=5))
    engine.speculation.drafter = "none"
    engine.calibrate()
    engine._runner = CountingRunner(engine.target.model, engine.target.device)
    cancel = threading.Event()
    prompt = [(7 * i) % 1000 + 5 for i in range(2 * speculative.PREFILL_CHUNK - 10)]
    finished = engine.generate_ids(prompt, cancel=cancel)
    assert finished.reason == "cancelled"
    assert CountingRunner.prefills == 1 and finished.token_ids == ()
    assert engine._runner.cache_length == speculative.PREFILL_CHUNK  # the rest of the prompt was never read


def _chat_interactively(workspace: Workspace, lines: str) -> tuple[subprocess.CompletedProcess, list]:
    """`tandem-cli chat` on the tiny model with `lines` typed in; the conversations the chat stored."""
    from engine.store.database import Store

    workspace.fresh_databases()
    with Store(workspace.good_db) as store:
        kept = {c.id for c in store.list_conversations()}
    case = Case(
        "interactive",
        ("chat", "--max-new-tokens", "4", "--target", "{ws.tiny}", "--draft", "none", "--db", "{ws.good_db}"),
        "",
        stdin=lines.encode(),
    )
    result = run_case(case, workspace)
    with Store(workspace.good_db) as store:
        stored = [
            [(m.role, m.content) for m in store.thread(c.id)]
            for c in reversed(store.list_conversations())
            if c.id not in kept
        ]
    return result, stored


def test_an_over_long_message_is_refused_and_the_chat_goes_on(workspace: Workspace):
    result, stored = _chat_interactively(workspace, "word " * 200 + "\nhello\n")
    stderr = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in stderr, stderr
    assert "Send a shorter message, or /new to start a new conversation." in stderr
    assert "delete earlier messages" not in stderr  # the terminal chat cannot
    # the refused message left no trace; the next one was answered
    assert len(stored) == 1 and [role for role, _ in stored[0]] == ["user", "assistant"]
    assert stored[0][0] == ("user", "hello")


def test_new_starts_a_new_conversation_and_help_lists_the_commands(workspace: Workspace):
    result, stored = _chat_interactively(workspace, "hello\n/help\n/frobnicate\n/NEW\nagain\n")
    stderr = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in stderr, stderr
    assert "/help lists the commands" in stderr  # said when the chat starts
    assert "/new " in stderr and "start a new conversation" in stderr  # the list /help shows
    assert "Unknown command /frobnicate" in stderr
    assert "[new conversation]" in stderr
    # two stored conversations, one per /new
    assert [[(role, text) for role, text in thread if role == "user"] for thread in stored] == [
        [("user", "hello")],
        [("user", "again")],
    ]


def test_after_new_the_model_is_asked_about_the_new_conversation_alone(monkeypatch, capsys):
    """What converse hands the engine after /new: the system prompt and the new message, nothing before."""
    import io
    from types import SimpleNamespace

    from engine.cli.terminal import converse
    from engine.events import Finished
    from engine.stats import GenerationStats

    asked, resets = [], []

    def prepare_turn(messages):
        asked.append([m["content"] for m in messages])
        return lambda on_event, cancel: Finished("eos", "fine", (1,), GenerationStats())

    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n/new\nagain\n"))
    args = SimpleNamespace(system="be brief", message=None, stats=False)
    converse(args, "a model", None, prepare_turn, lambda finished: None, on_new=lambda: resets.append(1))
    assert asked == [["be brief", "hello"], ["be brief", "again"]]
    assert resets == [1]
