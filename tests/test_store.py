"""The conversation store: operations, branches, search, migrations, refusals, export and import.

Text strategies use hypothesis' default alphabet, which is every Unicode code point except the
surrogates U+D800..U+DFFF: SQLite stores UTF-8, and a lone surrogate has no UTF-8 form.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlite_utils
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import (
    CorruptDatabaseError,
    DatabaseLockedError,
    DiskFullError,
    ImportFormatError,
    ReadOnlyStorageError,
    SchemaTooNewError,
    StorageError,
)
from engine.store import export as store_export
from engine.store.database import SCHEMA_VERSION, Store, migrate
from engine.store.streaming import ThrottledUpdater

ROOT = Path(__file__).resolve().parents[1]
HYPOTHESIS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False) | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
stats_dicts = st.dictionaries(st.text(max_size=10), json_values, max_size=6)


def _chat(store: Store, turns: int = 2) -> int:
    cid = store.create_conversation("Chat", "org/target", {"k": 4, "drafter": "ngram"}, "Be brief.")
    for i in range(turns):
        store.add_message(cid, "user", f"question {i}")
        store.add_message(cid, "assistant", f"answer {i}", token_count=3, stats={"tokens_per_s": 10.0 + i})
    return cid


# --- conversations ---------------------------------------------------------------------------------


def test_database_is_wal_and_current_version(store):
    assert store.db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert {"conversations", "messages", "settings", "messages_fts"} <= set(store.db.table_names())


def test_default_path_is_in_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    with Store() as s:
        assert s.path == tmp_path / "data" / "tandem.db"
    assert (tmp_path / "data" / "tandem.db").exists()


def test_create_get_update_and_list_most_recent_first(store):
    first = store.create_conversation("First", "a/model", {"k": 3}, "sys")
    second = store.create_conversation("Second")
    conversation = store.get_conversation(first)
    assert (conversation.title, conversation.target_model, conversation.draft_settings) == (
        "First",
        "a/model",
        {"k": 3},
    )
    assert conversation.system_prompt == "sys"
    assert [c.id for c in store.list_conversations()] == [second, first]

    store.add_message(first, "user", "bump")
    assert [c.id for c in store.list_conversations()] == [first, second]

    store.rename_conversation(second, "Renamed")
    store.update_conversation(second, draft_settings={"k": 8}, system_prompt="new")
    updated = store.get_conversation(second)
    assert (updated.title, updated.draft_settings, updated.system_prompt) == ("Renamed", {"k": 8}, "new")
    assert [c.id for c in store.list_conversations()] == [second, first]
    with pytest.raises(KeyError):
        store.get_conversation(999)


def test_delete_restore_and_purge(store):
    cid = _chat(store)
    other = _chat(store)
    before = store.snapshot(cid)
    store.delete_conversation(cid)
    assert [c.id for c in store.list_conversations()] == [other]
    assert store.search("question") and all(hit.conversation_id == other for hit in store.search("question"))

    store.restore_conversation(cid)
    assert {c.id for c in store.list_conversations()} == {cid, other}
    assert store.snapshot(cid) == before

    store.delete_conversation(cid)
    assert store.purge_deleted() == 1
    assert (
        store.db.conn.execute("SELECT count(*) FROM messages WHERE conversation_id = ?", (cid,)).fetchone()[0]
        == 0
    )
    with pytest.raises(KeyError):
        store.get_conversation(cid)
    assert [m.content for m in store.thread(other)][-1] == "answer 1"


def test_duplicate_copies_every_branch_with_new_ids(store):
    cid = _chat(store)
    store.edit_message(store.thread(cid)[0].id, "edited question")
    copy = store.duplicate_conversation(cid)
    original, duplicate = store.snapshot(cid), store.snapshot(copy)
    assert duplicate["conversation"]["title"] == "Chat (copy)"
    assert {m["id"] for m in original["messages"]}.isdisjoint(m["id"] for m in duplicate["messages"])

    def shape(snapshot):
        index = {m["id"]: i for i, m in enumerate(snapshot["messages"])}
        return [
            (index.get(m["parent_id"]), m["role"], m["content"], m["created"], m["stats"], m["selected"])
            for m in snapshot["messages"]
        ]

    assert shape(duplicate) == shape(original)
    assert [m.content for m in store.thread(copy)] == [m.content for m in store.thread(cid)]


def test_settings_round_trip(store):
    assert store.get_setting("theme", "light") == "light"
    store.set_setting("theme", "dark")
    store.set_setting("recent", [1, 2, {"x": None}])
    store.set_setting("theme", "sepia")
    assert store.get_setting("theme") == "sepia"
    assert store.get_setting("recent") == [1, 2, {"x": None}]


def test_bad_role_and_status_are_refused(store):
    cid = store.create_conversation()
    with pytest.raises(ValueError):
        store.add_message(cid, "robot", "hi")
    with pytest.raises(ValueError):
        store.add_message(cid, "user", "hi", status="done")
    other = store.create_conversation()
    foreign = store.add_message(other, "user", "elsewhere")
    with pytest.raises(ValueError):
        store.add_message(cid, "user", "hi", parent_id=foreign)


# --- branches --------------------------------------------------------------------------------------


def test_edit_makes_a_branch_and_keeps_the_old_reply(store):
    cid = store.create_conversation()
    question = store.add_message(cid, "user", "What is 2+2?")
    reply = store.add_message(cid, "assistant", "4")
    store.add_message(cid, "user", "And 3+3?")
    store.add_message(cid, "assistant", "6")

    edited = store.edit_message(question, "What is 2+3?")
    assert [m.content for m in store.thread(cid)] == ["What is 2+3?"]
    new_reply = store.add_message(cid, "assistant", "5")
    assert [m.id for m in store.thread(cid)] == [edited, new_reply]
    assert [m.id for m in store.siblings(edited)] == [question, edited]

    # Back to the first version: the thread continues to the leaf last seen under it.
    assert [m.content for m in store.switch_branch(question)] == ["What is 2+2?", "4", "And 3+3?", "6"]
    assert [m.content for m in store.switch_branch(edited)] == ["What is 2+3?", "5"]

    # Regenerate the first reply: a sibling, while the original keeps its own continuation.
    store.switch_branch(question)
    regenerated = store.begin_assistant(cid, parent_id=question)
    store.finish_message(regenerated, text="four")
    assert [m.content for m in store.thread(cid)] == ["What is 2+2?", "four"]
    assert [m.id for m in store.siblings(reply)] == [reply, regenerated]
    assert [m.content for m in store.switch_branch(reply)][-1] == "6"


# --- streaming -------------------------------------------------------------------------------------


def test_streaming_reply_is_updated_then_finished(store):
    cid = store.create_conversation()
    store.add_message(cid, "user", "tell me")
    mid = store.begin_assistant(cid, meta={"drafter": "ngram", "k": 4})
    assert store.get_message(mid).status == "streaming"
    store.update_streaming(mid, "par")
    assert store.get_message(mid).content == "par"
    store.finish_message(mid, "cancelled", text="partial", stats={"tokens_per_s": 12.5}, token_count=2)
    message = store.get_message(mid)
    assert (message.status, message.content, message.token_count) == ("cancelled", "partial", 2)
    assert message.stats == {"drafter": "ngram", "k": 4, "tokens_per_s": 12.5}
    store.update_streaming(mid, "late text")  # a finished reply is not rewritten
    assert store.get_message(mid).content == "partial"
    store.set_message_stats(mid, {"acceptance_rate": 0.5})
    assert store.get_message(mid).stats == {"acceptance_rate": 0.5}
    with pytest.raises(ValueError):
        store.finish_message(mid, "streaming")


def test_throttled_updater_commits_on_its_own_within_the_interval(store):
    """No caller timer: a piece that is not followed by any other is still committed."""
    cid = store.create_conversation()
    mid = store.begin_assistant(cid)
    commits = []
    updater = ThrottledUpdater(store, mid, interval=0.05, on_commit=commits.append)
    updater.append("only piece")
    assert updater.flush(timeout=30)  # waits for the updater's own thread, which commits by itself
    assert store.get_message(mid).content == "only piece"
    updater.append(", and more")
    deadline = threading.Event()
    for _ in range(600):  # the updater's thread commits without any further call
        if store.get_message(mid).content == "only piece, and more":
            break
        deadline.wait(0.05)
    assert store.get_message(mid).content == "only piece, and more"
    assert commits[-1] == len("only piece, and more")
    updater.finish("complete", stats={"tokens_per_s": 1.0}, token_count=20)
    message = store.get_message(mid)
    assert message.content == "only piece, and more"
    assert (message.status, message.token_count, message.stats) == ("complete", 20, {"tokens_per_s": 1.0})


def test_throttled_updater_commits_the_oldest_uncommitted_piece_within_the_interval(store):
    """The promise a kill -9 relies on (tests/test_store_crash.py, tests/test_cli_crash.py): text not
    yet committed arrived less than `interval` ago. The updater reads the test's clock, so the rule is
    checked as such, however late a busy machine wakes its thread: a steady stream is committed one
    interval after its oldest piece, not one after its newest (which would never come)."""
    cid = store.create_conversation()
    mid = store.begin_assistant(cid)
    now = [100.0]
    commits: list[int] = []
    updater = ThrottledUpdater(store, mid, interval=0.5, on_commit=commits.append, clock=lambda: now[0])

    def committed(chars: int) -> bool:
        for _ in range(600):  # the updater's thread wakes within its margin of each due time
            if commits and commits[-1] == chars:
                return True
            threading.Event().wait(0.05)
        return False

    updater.append("first")
    for step in range(1, 5):  # a piece every 0.1 s: the next one always arrives before any commit is due
        now[0] = 100.0 + step * 0.1
        updater.append(" more")
    assert commits == []  # 0.4 s after the oldest piece: none is due yet
    now[0] = 100.5  # one interval after the oldest piece
    assert committed(len("first more more more more"))
    assert store.get_message(mid).content == "first more more more more"
    updater.append(" last")  # the next interval starts from this piece
    now[0] = 101.0
    assert committed(len("first more more more more last"))
    updater.finish("complete")


WRITER = """
import sys
from engine.store.database import Store
with Store(sys.argv[1]) as s:
    cid = s.create_conversation()
    s.add_message(cid, "user", "go")
    mid = s.begin_assistant(cid)
    s.update_streaming(mid, "half a rep")
    print(mid, flush=True)
    sys.stdin.readline()  # stays alive, writing, until told to go on
    s.update_streaming(mid, "half a reply, still written")
"""


def _writer(path):
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    return process, int(process.stdout.readline())


def test_reopening_recovers_a_reply_whose_writer_has_ended(tmp_path):
    path = tmp_path / "t.db"
    process, mid = _writer(path)
    process.communicate("\n", timeout=60)  # the writer ends without finishing its reply
    with Store(path) as s:
        assert s.recovered == 1
        message = s.get_message(mid)
        assert (message.status, message.content) == ("interrupted", "half a reply, still written")
    with Store(path) as s:
        assert s.recovered == 0


def test_reopening_leaves_a_live_writers_reply_alone(tmp_path):
    path = tmp_path / "t.db"
    process, mid = _writer(path)
    try:
        with Store(path) as s:  # a second process opens the store while the first still streams
            assert s.recovered == 0
            assert s.get_message(mid).status == "streaming"
    finally:
        process.communicate("\n", timeout=60)
    with Store(path) as s:
        message = s.get_message(mid)
        assert message.content == "half a reply, still written"  # the first writer's update landed
        assert s.recovered == 1 and s.get_message(mid).status == "interrupted"


def test_a_reply_written_in_this_process_is_not_recovered_by_a_second_store(tmp_path):
    path = tmp_path / "t.db"
    with Store(path) as s:
        mid = s.begin_assistant(s.create_conversation())
        with Store(path) as other:
            assert other.recovered == 0
        s.update_streaming(mid, "still mine")
        assert s.get_message(mid).content == "still mine"


# --- round trips -----------------------------------------------------------------------------------


@HYPOTHESIS
@given(
    title=st.text(),
    system_prompt=st.text(),
    draft_settings=stats_dicts,
    contents=st.lists(st.text(), min_size=1, max_size=5),
    stats=stats_dicts,
)
def test_any_unicode_round_trips_through_the_database(
    tmp_path_factory, title, system_prompt, draft_settings, contents, stats
):
    path = tmp_path_factory.mktemp("rt") / "t.db"
    with Store(path) as s:
        cid = s.create_conversation(title, "m", draft_settings, system_prompt)
        ids = [s.add_message(cid, "user", text, stats=stats) for text in contents]
    with Store(path) as s:
        conversation = s.get_conversation(cid)
        assert (conversation.title, conversation.system_prompt, conversation.draft_settings) == (
            title,
            system_prompt,
            draft_settings,
        )
        assert [(m.id, m.content, m.stats) for m in s.thread(cid)] == [
            (i, t, stats) for i, t in zip(ids, contents, strict=True)
        ]


def _branchy_conversation(s: Store, contents: list[str], stats: dict) -> int:
    cid = s.create_conversation(contents[0], "t/model", {"k": 5}, contents[-1])
    first = s.add_message(cid, "user", contents[0])
    for i, text in enumerate(contents[1:]):
        mid = s.add_message(cid, "assistant" if i % 2 == 0 else "user", text, stats=stats, token_count=i)
        if i % 3 == 2:
            s.edit_message(mid, text[::-1])
    s.edit_message(first, "edited " + contents[0])
    streaming = s.begin_assistant(cid, meta={"drafter": "model:small"})
    ThrottledUpdater(s, streaming).finish("error", stats=stats, token_count=1)
    s.switch_branch(first)
    return cid


@settings(HYPOTHESIS, max_examples=15)
@given(contents=st.lists(st.text(), min_size=1, max_size=8), stats=stats_dicts)
def test_json_export_import_round_trip_is_exact(tmp_path_factory, contents, stats):
    folder = tmp_path_factory.mktemp("export")
    with Store(folder / "a.db") as source:
        _branchy_conversation(source, contents, stats)
        _branchy_conversation(source, contents[::-1], {})
        exported = store_export.export_json(source, folder / "all.json")
        original = store_export.export_data(source)
        threads = {c.id: [m.id for m in source.thread(c.id)] for c in source.list_conversations()}
    with Store(folder / "b.db") as target:
        imported = store_export.import_json(target, exported)
        again = store_export.export_data(target)
        assert sorted(imported) == sorted(threads)
        assert {cid: [m.id for m in target.thread(cid)] for cid in imported} == threads
    del original["exported"], again["exported"]
    assert again == original


def test_import_into_a_used_database_gives_new_ids(store, tmp_path):
    cid = _chat(store)
    store.edit_message(store.thread(cid)[2].id, "other question")
    path = store_export.export_json(store, tmp_path / "one.json", [cid])
    (copy,) = store_export.import_json(store, path)
    assert copy != cid
    assert [m.content for m in store.thread(copy)] == [m.content for m in store.thread(cid)]
    assert len(store.snapshot(copy)["messages"]) == len(store.snapshot(cid)["messages"])


def test_import_refuses_other_files_and_changes_nothing(store, tmp_path):
    _chat(store)
    before = store_export.export_data(store)["conversations"]
    cases = {
        "garbage.json": b"\xff\xfe not json",
        "other.json": json.dumps({"format": "something else"}).encode(),
        "newer.json": json.dumps(
            {"format": store_export.FORMAT, "version": 99, "conversations": []}
        ).encode(),
        "no-fields.json": json.dumps(
            {
                "format": store_export.FORMAT,
                "version": 1,
                "conversations": [{"conversation": {"id": 5}, "messages": []}],
            }
        ).encode(),
        "broken.json": json.dumps(
            {
                "format": store_export.FORMAT,
                "version": 1,
                "conversations": [before[0], {"conversation": {"id": 1}, "messages": [{"id": 1}]}],
            }
        ).encode(),
    }
    for name, payload in cases.items():
        (tmp_path / name).write_bytes(payload)
        with pytest.raises(ImportFormatError):
            store_export.import_json(store, tmp_path / name)
    assert store_export.export_data(store)["conversations"] == before


def test_markdown_export_shows_the_visible_thread(store, tmp_path):
    cid = _chat(store)
    store.finish_message(
        store.begin_assistant(cid),
        text="with *stats*",
        stats={
            "acceptance_rate": 0.75,
            "tokens_per_s": 31.0,
            "speedup": 1.8,
            "current_k": 4,
            "drafter": "ngram",
        },
    )
    store.edit_message(store.thread(cid)[0].id, "replaced first question")
    store.switch_branch(store.siblings(store.thread(cid)[0].id)[0].id)
    path = store_export.export_markdown(store, tmp_path / "chat.md")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# Chat")
    assert "Be brief." in text and "question 1" in text and "with *stats*" in text
    assert "acceptance 75%" in text and "31.0 tokens/s" in text and "1.80× speed-up" in text
    assert "1 other version not shown" in text
    assert "replaced first question" not in text


def test_exports_are_atomic_and_errors_are_typed(store, tmp_path):
    cid = _chat(store)
    target = tmp_path / "out.json"
    target.write_text("old contents")
    store_export.export_json(store, target, [cid])
    assert json.loads(target.read_text())["conversations"][0]["conversation"]["id"] == cid
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    with pytest.raises(StorageError):
        store_export.export_json(store, tmp_path / "missing" / "out.json")


# --- search ----------------------------------------------------------------------------------------


def test_full_text_search(store):
    first = store.create_conversation("a")
    hit = store.add_message(first, "user", "Speculative decoding drafts tokens with a small model.")
    store.add_message(first, "assistant", "The target verifies them in one forward pass.")
    second = store.create_conversation("b")
    streaming = store.begin_assistant(second)
    store.update_streaming(streaming, "Verification is parallel")

    results = store.search("speculative")
    assert [(r.conversation_id, r.message_id) for r in results] == [(first, hit)]
    assert "[Speculative]" in results[0].snippet
    assert {r.message_id for r in store.search("verif")} == {hit + 1, streaming}  # prefix on the last word
    assert store.search("small model") and not store.search("small elephant")
    assert store.search('"unbalanced quote') == [] and store.search("AND OR NOT (") == []
    assert store.search("   ") == []
    edited = store.edit_message(hit, "nothing here now")
    assert {r.message_id for r in store.search("speculative")} == {hit}
    assert [r.message_id for r in store.search("nothing")] == [edited]


# --- migrations and refusals -----------------------------------------------------------------------


def test_migrates_a_version_1_database(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite_utils.Database(sqlite3.connect(path, isolation_level=None))
    migrate(db, target=1)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    assert "parent_id" not in db["messages"].columns_dict
    db.execute(
        "INSERT INTO conversations (id, title, created, updated, target_model, draft_settings, system_prompt) "
        "VALUES (7, 'old chat', '2024-01-01T00:00:00.000000Z', '2024-01-02T00:00:00.000000Z', 'm', '{\"k\": 2}', '')"
    )
    rows = [
        (10, 7, "user", "first old question", "complete", None, None),
        (11, 7, "assistant", "first old answer", "complete", 4, '{"tokens_per_s": 9.5}'),
        (12, 7, "user", "second old question", "complete", None, None),
        (13, 7, "assistant", "cut off", "streaming", None, None),
    ]
    for row in rows:
        db.execute(
            "INSERT INTO messages (id, conversation_id, role, content, created, status, token_count, stats) "
            "VALUES (?, ?, ?, ?, '2024-01-01T00:00:01.000000Z', ?, ?, ?)",
            row,
        )
    db.close()

    with Store(path) as s:
        assert s.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        thread = s.thread(7)
        assert [(m.id, m.parent_id, m.content) for m in thread] == [
            (10, None, "first old question"),
            (11, 10, "first old answer"),
            (12, 11, "second old question"),
            (13, 12, "cut off"),
        ]
        assert thread[1].stats == {"tokens_per_s": 9.5} and thread[1].token_count == 4
        assert thread[3].status == "interrupted"
        assert [c.id for c in s.list_conversations()] == [7]
        assert [r.message_id for r in s.search("old question")] in ([10, 12], [12, 10])
        s.add_message(7, "user", "a new one")
        assert s.thread(7)[-1].parent_id == 13
    backup = tmp_path / "old.db.v1.bak"
    with sqlite3.connect(backup) as copy:
        assert copy.execute("PRAGMA user_version").fetchone()[0] == 1
        assert copy.execute("SELECT count(*) FROM messages").fetchone()[0] == 4


def test_a_newer_database_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "future.db"
    with Store(path) as s:
        _chat(s)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.execute("PRAGMA journal_mode = DELETE")  # so that switching it to WAL would show in the bytes
    conn.close()
    before = (path.read_bytes(), os.stat(path).st_mtime_ns, sorted(os.listdir(tmp_path)))
    with pytest.raises(SchemaTooNewError) as info:
        Store(path)
    assert info.value.found == SCHEMA_VERSION + 1 and info.value.supported == SCHEMA_VERSION
    assert "newer version of Tandem" in str(info.value)
    assert (path.read_bytes(), os.stat(path).st_mtime_ns, sorted(os.listdir(tmp_path))) == before


def test_garbage_file_is_corrupt_and_moved_aside_intact(tmp_path):
    path = tmp_path / "tandem.db"
    garbage = os.urandom(8192)
    path.write_bytes(garbage)
    with pytest.raises(CorruptDatabaseError) as info:
        Store(path)
    assert info.value.path == path
    assert path.read_bytes() == garbage
    moved = Store.move_aside(info.value.path)
    assert moved.read_bytes() == garbage and moved.parent == tmp_path
    assert not path.exists()
    with Store(path) as fresh:
        assert fresh.list_conversations() == []
    path.write_bytes(b"not a database either")
    assert Store.move_aside(path) != moved  # a second one does not overwrite the first
    assert moved.read_bytes() == garbage


def test_damaged_pages_are_reported_as_corrupt(tmp_path):
    path = tmp_path / "tandem.db"
    with Store(path) as s:
        cid = s.create_conversation()
        with s.transaction():
            for i in range(300):
                s.add_message(cid, "user", f"message number {i} " * 20)
        s.db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    page = 4096
    assert len(data) > 8 * page
    for start in range(2 * page, len(data), 3 * page):
        data[start : start + page] = os.urandom(page)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDatabaseError):
        Store(path)


def test_disk_full_is_a_typed_error(store):
    cid = store.create_conversation()
    pages = store.db.conn.execute("PRAGMA page_count").fetchone()[0]
    store.db.conn.execute(f"PRAGMA max_page_count = {pages + 2}")
    with pytest.raises(DiskFullError, match="full"):
        store.add_message(cid, "user", "x" * 200_000)
    store.db.conn.execute("PRAGMA max_page_count = 1000000")
    store.add_message(cid, "user", "fits now")
    assert [m.content for m in store.thread(cid)] == ["fits now"]


def test_read_only_is_a_typed_error(store):
    cid = store.create_conversation()
    store.db.conn.execute("PRAGMA query_only = 1")
    with pytest.raises(ReadOnlyStorageError):
        store.add_message(cid, "user", "hello")


def test_a_locked_database_is_a_typed_error(tmp_path):
    path = tmp_path / "t.db"
    Store(path).close()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(DatabaseLockedError):
            Store(path, busy_timeout_s=0.05)
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_a_folder_is_refused_and_never_offered_to_be_moved_aside(tmp_path):
    with pytest.raises(StorageError, match="is a folder") as info:
        Store(tmp_path)
    assert not isinstance(info.value, CorruptDatabaseError)
    assert tmp_path.is_dir()


def test_markdown_export_keeps_the_basis_of_the_speedup(store, tmp_path):
    """The export words the speed-up as the app does: an estimate says so, and so does a measurement."""
    from engine.stats import MIN_PLAIN_STEPS, GenerationStats

    cid = _chat(store)
    common = dict(
        drafter="ngram",
        drafted=10,
        accepted=6,
        generated_tokens=40,
        total_time_s=3.0,
        prefill_time_s=1.0,
        target_step_time_s=0.1,
    )
    estimate = GenerationStats(**common).to_dict()
    measured = GenerationStats(
        **common, plain_steps=MIN_PLAIN_STEPS, plain_step_time_s=MIN_PLAIN_STEPS * 0.08
    ).to_dict()
    for record in (estimate, measured):
        store.finish_message(store.begin_assistant(cid), text="reply", stats=record)
        cid = _chat(store)
    text = store_export.export_markdown(store, tmp_path / "all.md").read_text(encoding="utf-8")
    assert "2.00× speed-up vs the target alone (estimate)" in text
    assert "1.60× speed-up vs the target alone (measured in this reply)" in text
    assert "20.0 tokens/s" in text  # decode speed, as the footer shows it
