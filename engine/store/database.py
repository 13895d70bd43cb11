"""Conversation storage: one SQLite file in WAL mode. The schema and its migrations are in schema.py,
the records in records.py, streaming replies in streaming.py, export and import in export.py.

Branches: a message points at its parent (None for the first message of a conversation). Editing a
message or regenerating a reply adds a sibling, so the old text stays reachable. `selected` is a
counter within a conversation: the visible thread is the path from the root to the message with the
highest value. That message is always a leaf, because a new message and a switch of branch both take
the next value.

Durability: WAL with synchronous=FULL, so a committed write survives the process being killed and the
machine losing power. A reply being generated is a row with status 'streaming' that a
ThrottledUpdater rewrites as text arrives. The row records its writer's lock slot (locks.py);
opening the store turns the 'streaming' rows whose writer is gone into 'interrupted', keeping their
text, and leaves alone the rows that another live process is still writing.

Several processes may write at once: every write transaction starts with BEGIN IMMEDIATE, so a second
writer waits for the first (up to `busy_timeout_s`) instead of failing on a lock upgrade. It tries
again every millisecond (schema.begin_immediate), so another process's run of short writes cannot
keep it waiting to the end of the run. An app or a
terminal chat that owns the database also takes the instance lock (acquire_instance_lock), so a second
one is told the database is in use instead of writing beside the first.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlite_utils

from engine.errors import DatabaseLockedError, StorageError
from engine.paths import default_db_path
from engine.store import branches, locks
from engine.store.records import (  # noqa: F401  (re-exported: the store's public names)
    ACTIVE_LEAF,
    FINAL_STATUSES,
    ROLES,
    STATUSES,
    Conversation,
    Message,
    SearchHit,
    check_text,
    conversation_from_row,
    dumps,
    message_from_row,
    utc_now,
)
from engine.store.schema import (  # noqa: F401
    SCHEMA_VERSION,
    begin_immediate,
    migrate,
    move_aside,
    os_storage_error,
    prepare,
    remove_empty,
    storage_error,
    translated_errors,
)
from engine.store.snapshots import insert_snapshot, take_snapshot


class Store:
    """The conversation database. Use it from one thread; open another Store for another thread."""

    def __init__(self, path: str | os.PathLike | None = None, *, busy_timeout_s: float = 30.0):
        self.path = Path(path) if path is not None else default_db_path()
        self.busy_timeout_s = busy_timeout_s
        self.recovered = 0  # replies cut off by a crash or kill, marked 'interrupted' at open
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise os_storage_error(exc, self.path.parent, "create the folder for") from exc
        if self.path.is_dir():
            # not CorruptDatabaseError: a folder must never be offered to be moved aside
            raise StorageError(f"{self.path} is a folder, not a Tandem database: give a file name.")
        created = not self.path.exists()
        with translated_errors(self.path):
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=busy_timeout_s)
        try:
            self.db = prepare(conn, self.path)
            self.recovered = self.recover_interrupted()
        except BaseException:
            conn.close()
            if created:  # a create that failed (a full disk) leaves no empty file to trip the next start
                remove_empty(self.path)
            raise

    def recover_interrupted(self) -> int:
        """Mark 'interrupted' every streaming reply whose writer has ended; returns how many."""
        with self.transaction() as db:
            rows = db.execute("SELECT id, writer FROM messages WHERE status = 'streaming'").fetchall()
            gone = [
                mid for mid, writer in rows if writer is None or not locks.writer_alive(self.path, writer)
            ]
            for message_id in gone:
                db.execute("UPDATE messages SET status = 'interrupted' WHERE id = ?", (message_id,))
        return len(gone)

    def acquire_instance_lock(self) -> None:
        """Claim the database for this app or terminal chat, until close().

        Raises DatabaseLockedError when another Tandem (app or terminal chat) has claimed it. Stores
        opened without the claim (tests, tools, the streaming writer) still read and write.
        """
        if not locks.acquire_instance(self.path, self):
            raise DatabaseLockedError(
                f"{self.path} is in use by another Tandem (the app or a terminal chat). Close that one "
                "first, or choose another database with --db."
            )

    @contextlib.contextmanager
    def instance_lock(self) -> Iterator[Store]:
        """`with store.instance_lock():` holds the claim of acquire_instance_lock for the block."""
        self.acquire_instance_lock()
        try:
            yield self
        finally:
            locks.release_instance(self.path, self)

    def close(self) -> None:
        locks.release_instance(self.path, self)
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite_utils.Database]:
        """All writes inside commit together or not at all. Nested blocks become savepoints.

        BEGIN IMMEDIATE takes the write lock up front, waiting for another writer up to the busy
        timeout; a deferred BEGIN would fail at once when its read turned into a write.
        """
        conn = self.db.conn
        with translated_errors(self.path):
            if conn.in_transaction:
                with self.db.atomic():
                    yield self.db
                return
            begin_immediate(conn)
            try:
                yield self.db
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _rows(self, sql: str, params: tuple | dict = ()) -> list[sqlite3.Row]:
        with translated_errors(self.path):
            cursor = self.db.conn.cursor()
            cursor.row_factory = sqlite3.Row
            return cursor.execute(sql, params).fetchall()

    move_aside = staticmethod(move_aside)

    # --- conversations -----------------------------------------------------------------------------

    def create_conversation(
        self,
        title: str = "New conversation",
        target_model: str = "",
        draft_settings: dict | None = None,
        system_prompt: str = "",
    ) -> int:
        now = utc_now()
        with self.transaction() as db:
            table = db["conversations"].insert(
                {
                    "title": title,
                    "created": now,
                    "updated": now,
                    "target_model": target_model,
                    "draft_settings": dumps(draft_settings or {}),
                    "system_prompt": system_prompt,
                }
            )
            return table.last_pk

    def get_conversation(self, conversation_id: int) -> Conversation:
        rows = self._rows("SELECT * FROM conversations WHERE id = ?", (conversation_id,))
        if not rows:
            raise KeyError(f"no conversation {conversation_id}")
        return conversation_from_row(rows[0])

    def list_conversations(self, include_deleted: bool = False) -> list[Conversation]:
        """Most recently updated first."""
        where = "" if include_deleted else "WHERE deleted IS NULL"
        rows = self._rows(f"SELECT * FROM conversations {where} ORDER BY updated DESC, id DESC")
        return [conversation_from_row(row) for row in rows]

    def update_conversation(
        self,
        conversation_id: int,
        *,
        title: str | None = None,
        target_model: str | None = None,
        draft_settings: dict | None = None,
        system_prompt: str | None = None,
    ) -> None:
        """Change the given fields (None leaves one as it is) and mark the conversation updated."""
        changes: dict[str, Any] = {"updated": utc_now()}
        if title is not None:
            changes["title"] = title
        if target_model is not None:
            changes["target_model"] = target_model
        if draft_settings is not None:
            changes["draft_settings"] = dumps(draft_settings)
        if system_prompt is not None:
            changes["system_prompt"] = system_prompt
        self.get_conversation(conversation_id)
        with self.transaction() as db:
            db["conversations"].update(conversation_id, changes)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.update_conversation(conversation_id, title=title)

    def delete_conversation(self, conversation_id: int) -> None:
        """Hide a conversation; restore_conversation undoes it, purge_deleted removes it for good."""
        self.get_conversation(conversation_id)
        with self.transaction() as db:
            db.execute("UPDATE conversations SET deleted = ? WHERE id = ?", (utc_now(), conversation_id))

    def restore_conversation(self, conversation_id: int) -> None:
        with self.transaction() as db:
            db.execute("UPDATE conversations SET deleted = NULL WHERE id = ?", (conversation_id,))

    def purge_deleted(self) -> int:
        """Remove soft-deleted conversations and their messages for good; returns how many."""
        with self.transaction() as db:
            db.execute(
                "DELETE FROM messages WHERE conversation_id IN (SELECT id FROM conversations WHERE deleted IS NOT NULL)"
            )
            return db.execute("DELETE FROM conversations WHERE deleted IS NOT NULL").rowcount

    def duplicate_conversation(self, conversation_id: int, title: str | None = None) -> int:
        """A copy with every branch; new ids, new created/updated times, message times kept."""
        snapshot = self.snapshot(conversation_id)
        now = utc_now()
        original = snapshot["conversation"]
        snapshot["conversation"] = {
            **original,
            "title": title if title is not None else f"{original['title']} (copy)",
            "created": now,
            "updated": now,
        }
        return self.insert_snapshot(snapshot, keep_ids=False)

    # --- messages ----------------------------------------------------------------------------------

    def get_message(self, message_id: int) -> Message:
        rows = self._rows("SELECT * FROM messages WHERE id = ?", (message_id,))
        if not rows:
            raise KeyError(f"no message {message_id}")
        return message_from_row(rows[0])

    def active_leaf(self, conversation_id: int) -> int | None:
        """The last message of the visible thread; None for an empty conversation."""
        rows = self._rows(
            "SELECT id FROM messages WHERE conversation_id = ? ORDER BY selected DESC, id DESC LIMIT 1",
            (conversation_id,),
        )
        return rows[0]["id"] if rows else None

    def _next_selected(self, conversation_id: int) -> int:
        rows = self._rows(
            "SELECT coalesce(max(selected), 0) + 1 AS next FROM messages WHERE conversation_id = ?",
            (conversation_id,),
        )
        return rows[0]["next"]

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        parent_id: int | None = ACTIVE_LEAF,
        status: str = "complete",
        token_count: int | None = None,
        stats: dict | None = None,
    ) -> int:
        """Commit one message and make it the end of the visible thread.

        parent_id defaults to the current end of the visible thread; None starts a new root (a branch
        of the first message). The user's message is committed before generation starts.
        """
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
        check_text(content)
        with self.transaction() as db:  # the reads too, so a second writer cannot slip in between
            self.get_conversation(conversation_id)
            if parent_id is ACTIVE_LEAF:
                parent_id = self.active_leaf(conversation_id)
            elif parent_id is not None and self.get_message(parent_id).conversation_id != conversation_id:
                raise ValueError(f"message {parent_id} is not in conversation {conversation_id}")
            now = utc_now()
            row = {
                "conversation_id": conversation_id,
                "parent_id": parent_id,
                "role": role,
                "content": content,
                "created": now,
                "status": status,
                "token_count": token_count,
                "stats": None if stats is None else dumps(stats),
                "selected": self._next_selected(conversation_id),
            }
            if status == "streaming":
                row["writer"] = locks.writer_slot(self.path)
            message_id = db["messages"].insert(row).last_pk
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        return message_id

    def edit_message(self, message_id: int, content: str) -> int:
        """Edit as a branch: a new sibling with the new text becomes visible; the old one stays."""
        old = self.get_message(message_id)
        return self.add_message(old.conversation_id, old.role, content, parent_id=old.parent_id)

    def begin_assistant(
        self, conversation_id: int, parent_id: int | None = ACTIVE_LEAF, meta: dict | None = None
    ) -> int:
        """Create an empty 'streaming' reply. Regenerating is begin_assistant(c, parent_id=<user msg>).

        meta (models, drafter, K...) becomes the message's first stats; finish_message merges into it.
        """
        return self.add_message(
            conversation_id, "assistant", "", parent_id=parent_id, status="streaming", stats=meta
        )

    def update_streaming(self, message_id: int, text: str) -> None:
        """Commit the text of a streaming reply so far. One small transaction; the caller throttles."""
        check_text(text, "The reply")
        with self.transaction() as db:
            db.execute(
                "UPDATE messages SET content = ? WHERE id = ? AND status = 'streaming'", (text, message_id)
            )

    def finish_message(
        self,
        message_id: int,
        status: str = "complete",
        *,
        text: str | None = None,
        stats: dict | None = None,
        token_count: int | None = None,
    ) -> None:
        """End a streaming reply as complete, cancelled or error, keeping its text."""
        if status not in FINAL_STATUSES:
            raise ValueError(f"status must be one of {FINAL_STATUSES}, not {status!r}")
        message = self.get_message(message_id)
        merged = message.stats if stats is None else {**(message.stats or {}), **stats}
        with self.transaction() as db:
            db.execute(
                "UPDATE messages SET content = coalesce(?, content), status = ?, "
                "token_count = coalesce(?, token_count), stats = ? WHERE id = ?",
                (text, status, token_count, None if merged is None else dumps(merged), message_id),
            )
            db.execute(
                "UPDATE conversations SET updated = ? WHERE id = ?", (utc_now(), message.conversation_id)
            )

    def set_message_stats(self, message_id: int, stats: dict | None) -> None:
        """Replace a message's generation stats."""
        with self.transaction() as db:
            db.execute(
                "UPDATE messages SET stats = ? WHERE id = ?",
                (None if stats is None else dumps(stats), message_id),
            )

    # --- branches (branches.py) --------------------------------------------------------------------

    def thread(self, conversation_id: int) -> list[Message]:
        """The visible thread: root first, ending at the most recently selected leaf."""
        return branches.thread(self, conversation_id)

    def siblings(self, message_id: int) -> list[Message]:
        """The alternatives to a message (itself included), oldest first: its edits or regenerations."""
        return branches.siblings(self, message_id)

    def switch_branch(self, message_id: int) -> list[Message]:
        """Make `message_id` visible, continuing to the leaf below it selected last; the new thread."""
        return branches.switch_branch(self, message_id)

    # --- search ------------------------------------------------------------------------------------

    def search(self, text: str, limit: int = 50, marks: tuple[str, str] = ("[", "]")) -> list[SearchHit]:
        """Full-text search over message content, best match first, in visible conversations.

        Every word must appear; the last may be a prefix ("spec" finds "speculative"). The user's text
        is quoted, so FTS5 operators in it are taken literally.
        """
        words = text.split()
        if not words:
            return []
        query = " ".join('"' + word.replace('"', '""') + '"' for word in words) + "*"
        rows = self._rows(
            """
            SELECT messages.conversation_id, messages.id,
                   snippet(messages_fts, 0, ?, ?, '…', 12) AS snippet
            FROM messages_fts
            JOIN messages ON messages.id = messages_fts.rowid
            JOIN conversations ON conversations.id = messages.conversation_id
            WHERE messages_fts MATCH ? AND conversations.deleted IS NULL
            ORDER BY rank LIMIT ?
            """,
            (marks[0], marks[1], query, limit),
        )
        return [SearchHit(row["conversation_id"], row["id"], row["snippet"]) for row in rows]

    # --- settings ----------------------------------------------------------------------------------

    def get_setting(self, key: str, default: Any = None) -> Any:
        rows = self._rows("SELECT value FROM settings WHERE key = ?", (key,))
        return json.loads(rows[0]["value"]) if rows else default

    def set_setting(self, key: str, value: Any) -> None:
        """Store any JSON-serialisable value."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO settings (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, dumps(value)),
            )

    # --- snapshots: the unit of export, import and duplicate ---------------------------------------

    def snapshot(self, conversation_id: int) -> dict:
        """One conversation with every branch, as plain JSON-ready data (see snapshots.py)."""
        return take_snapshot(self, conversation_id)

    def insert_snapshot(self, snapshot: dict, keep_ids: bool = True) -> int:
        """Insert a snapshot as a new conversation; returns its id (see snapshots.insert_snapshot)."""
        return insert_snapshot(self, snapshot, keep_ids)
