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
    return Workspace(tmp_path_factory.mktemp("bad-inputs"), builtin_tokenizer)


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
    if case.wrap and not can_wrap():
        pytest.skip("needs unshare -rm to make a read-only or full disk")
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
    assert result.returncode == 2, (result.returncode, stderr)
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
