"""Conversation storage: one SQLite file in WAL mode, written from one thread.

Tables (schema version SCHEMA_VERSION, kept in PRAGMA user_version):
  conversations  id, title, created, updated, target_model, draft_settings (JSON), system_prompt, deleted
  messages       id, conversation_id, parent_id, role, content, created, status, token_count,
                 stats (JSON), selected
  settings       key, value (JSON)
  messages_fts   FTS5 index over messages.content, kept in sync by triggers

Branches: a message points at its parent (None for the first message of a conversation). Editing a
message or regenerating a reply adds a sibling, so the old text stays reachable. `selected` is a
counter within a conversation: the visible thread is the path from the root to the message with the
highest value. That message is always a leaf, because a new message and a switch of branch both take
the next value.

Timestamps are ISO 8601 UTC strings with microseconds, "2024-05-01T12:00:00.000000Z": fixed width, so
they sort as text.

Durability: WAL with synchronous=FULL, so a committed write survives the process being killed and the
machine losing power. A reply being generated is a row with status 'streaming' whose content the GUI
thread rewrites as text arrives (ThrottledUpdater does it at most every `interval` seconds); opening the
store turns leftovers from a crash into 'interrupted', keeping their text.

Text: SQLite holds valid Unicode only. A Python str with a lone surrogate (U+D800..U+DFFF) cannot be
encoded as UTF-8 and sqlite3 refuses it; every other string round-trips exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlite_utils

from engine.errors import (
    CorruptDatabaseError,
    DatabaseLockedError,
    DiskFullError,
    ImportFormatError,
    ReadOnlyStorageError,
    SchemaTooNewError,
    StorageError,
)
from engine.paths import default_db_path

ROLES = ("system", "user", "assistant")
STATUSES = ("complete", "streaming", "cancelled", "error", "interrupted")
FINAL_STATUSES = ("complete", "cancelled", "error")


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------------
# Schema and migrations. MIGRATIONS[i] takes a database at version i to version i + 1; never edit one
# that has shipped, add a new one.


def _v1_initial(db: sqlite_utils.Database) -> None:
    """Conversations holding a linear list of messages; settings; full-text search."""
    db["conversations"].create(
        {
            "id": int,
            "title": str,
            "created": str,
            "updated": str,
            "target_model": str,
            "draft_settings": str,
            "system_prompt": str,
        },
        pk="id",
        not_null={"title", "created", "updated"},
    )
    db["messages"].create(
        {
            "id": int,
            "conversation_id": int,
            "role": str,
            "content": str,
            "created": str,
            "status": str,
            "token_count": int,
            "stats": str,
        },
        pk="id",
        foreign_keys=[("conversation_id", "conversations", "id")],
        not_null={"conversation_id", "role", "content", "created", "status"},
    )
    db["messages"].create_index(["conversation_id"])
    db["settings"].create({"key": str, "value": str}, pk="key", not_null={"value"})
    db["messages"].enable_fts(["content"], create_triggers=True)


def _v2_branches(db: sqlite_utils.Database) -> None:
    """Messages form a tree, so edits and regenerations keep the old text; conversations soft-delete."""
    db.execute("ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id)")
    db.execute("ALTER TABLE messages ADD COLUMN selected INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE conversations ADD COLUMN deleted TEXT")
    # Version 1 threads were linear: each message follows the one before it in the same conversation.
    db.execute(
        """
        WITH ordered AS (
            SELECT id, lag(id) OVER w AS previous, row_number() OVER w AS position
            FROM messages WINDOW w AS (PARTITION BY conversation_id ORDER BY id)
        )
        UPDATE messages SET parent_id = ordered.previous, selected = ordered.position
        FROM ordered WHERE messages.id = ordered.id
        """
    )
    db["messages"].create_index(["parent_id"])


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_v1_initial, _v2_branches]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(db: sqlite_utils.Database, target: int = SCHEMA_VERSION) -> None:
    """Run the migrations from the database's version up to `target`, each in its own transaction."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    for number in range(version, target):
        with db.atomic():
            MIGRATIONS[number](db)
            db.execute(f"PRAGMA user_version = {number + 1}")


# ---------------------------------------------------------------------------------------------------
# Errors: the environment's fault (shown to the user) versus bugs (raised as they are).


def storage_error(exc: sqlite3.Error, path: Path) -> StorageError | None:
    """The typed, readable error for an SQLite failure the user can act on; None for a bug."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if code is not None else None
    if primary == sqlite3.SQLITE_FULL:
        return DiskFullError(f"The disk holding {path} is full. Free some space and try again.")
    if primary == sqlite3.SQLITE_READONLY:
        return ReadOnlyStorageError(
            f"{path} cannot be written to. Check the file and its folder are writable, or choose another "
            "location with --db."
        )
    if primary == sqlite3.SQLITE_CANTOPEN:
        return ReadOnlyStorageError(f"{path} cannot be opened. Check the folder exists and is writable.")
    if primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return CorruptDatabaseError(
            f"{path} is damaged or is not a Tandem database. It can be moved aside (kept, not deleted) "
            "and a fresh one started.",
            path,
        )
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return DatabaseLockedError(f"{path} is in use by another program, perhaps a second Tandem.")
    if primary == sqlite3.SQLITE_IOERR:
        return StorageError(f"Reading or writing {path} failed (disk I/O error): {exc}")
    return None


@contextlib.contextmanager
def translated_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        error = storage_error(exc, path)
        if error is None:
            raise
        raise error from exc


# ---------------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created: str
    updated: str
    target_model: str
    draft_settings: dict
    system_prompt: str
    deleted: str | None = None  # when it was soft-deleted; None while visible


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    parent_id: int | None
    role: str
    content: str
    created: str
    status: str
    token_count: int | None
    stats: dict | None
    selected: int


@dataclass(frozen=True)
class SearchHit:
    conversation_id: int
    message_id: int
    snippet: str


def _conversation(row: sqlite3.Row) -> Conversation:
    return Conversation(
        id=row["id"],
        title=row["title"],
        created=row["created"],
        updated=row["updated"],
        target_model=row["target_model"] or "",
        draft_settings=json.loads(row["draft_settings"]) if row["draft_settings"] else {},
        system_prompt=row["system_prompt"] or "",
        deleted=row["deleted"],
    )


def _message(row: sqlite3.Row) -> Message:
    return Message(
        id=row["id"],
        conversation_id=row["conversation_id"],
        parent_id=row["parent_id"],
        role=row["role"],
        content=row["content"],
        created=row["created"],
        status=row["status"],
        token_count=row["token_count"],
        stats=json.loads(row["stats"]) if row["stats"] is not None else None,
        selected=row["selected"],
    )


class _ActiveLeaf:
    def __repr__(self) -> str:
        return "ACTIVE_LEAF"


ACTIVE_LEAF: Any = _ActiveLeaf()  # parent_id default: append to the visible thread


# ---------------------------------------------------------------------------------------------------


class Store:
    """The conversation database. Use it from one thread; open another Store for another thread."""

    def __init__(self, path: str | os.PathLike | None = None, *, busy_timeout_s: float = 5.0):
        self.path = Path(path) if path is not None else default_db_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReadOnlyStorageError(f"Cannot create the folder for {self.path}: {exc.strerror}.") from exc
        with translated_errors(self.path):
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=busy_timeout_s)
        try:
            self.db = self._open(conn)
        except BaseException:
            conn.close()
            raise

    def _open(self, conn: sqlite3.Connection) -> sqlite_utils.Database:
        with translated_errors(self.path):
            # Read the version before anything writes: a too-new database is left exactly as it is.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise SchemaTooNewError(
                    f"{self.path} was written by a newer version of Tandem (schema {version}; this version "
                    f"reads up to {SCHEMA_VERSION}). Update Tandem; the file has not been changed.",
                    self.path,
                    version,
                    SCHEMA_VERSION,
                )
            if version > 0:
                problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
                if problems != ["ok"]:
                    raise CorruptDatabaseError(
                        f"{self.path} is damaged ({problems[0]}). It can be moved aside (kept, not deleted) "
                        "and a fresh one started.",
                        self.path,
                    )
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            db = sqlite_utils.Database(conn)
            if 0 < version < SCHEMA_VERSION:
                self._backup(conn, version)
            migrate(db)
            with db.atomic():
                cursor = conn.execute("UPDATE messages SET status = 'interrupted' WHERE status = 'streaming'")
                self.recovered = cursor.rowcount  # replies cut off by a crash or kill
        return db

    def _backup(self, conn: sqlite3.Connection, version: int) -> None:
        """Copy an old database before migrating it, once per version: <name>.v<version>.bak."""
        target = self.path.with_name(f"{self.path.name}.v{version}.bak")
        if target.exists():
            return
        copy = sqlite3.connect(target)
        try:
            conn.backup(copy)
        finally:
            copy.close()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite_utils.Database]:
        """All writes inside commit together or not at all. Nested blocks become savepoints."""
        with translated_errors(self.path), self.db.atomic():
            yield self.db

    def _rows(self, sql: str, params: tuple | dict = ()) -> list[sqlite3.Row]:
        with translated_errors(self.path):
            cursor = self.db.conn.cursor()
            cursor.row_factory = sqlite3.Row
            return cursor.execute(sql, params).fetchall()

    @staticmethod
    def move_aside(path: str | os.PathLike) -> Path:
        """Rename a damaged database (and its -wal/-shm) to <name>.corrupt-<time>; returns the new path.

        Nothing is deleted: the user or a recovery tool can still read the old file.
        """
        path = Path(path)
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        target = path.with_name(f"{path.name}.corrupt-{stamp}")
        counter = 1
        while target.exists():
            counter += 1
            target = path.with_name(f"{path.name}.corrupt-{stamp}-{counter}")
        try:
            os.rename(path, target)
            for suffix in ("-wal", "-shm"):
                side = path.with_name(path.name + suffix)
                if side.exists():
                    os.rename(side, target.with_name(target.name + suffix))
        except OSError as exc:
            raise ReadOnlyStorageError(f"Cannot move {path} aside: {exc.strerror}.") from exc
        return target

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
                    "draft_settings": _dumps(draft_settings or {}),
                    "system_prompt": system_prompt,
                }
            )
            return table.last_pk

    def get_conversation(self, conversation_id: int) -> Conversation:
        rows = self._rows("SELECT * FROM conversations WHERE id = ?", (conversation_id,))
        if not rows:
            raise KeyError(f"no conversation {conversation_id}")
        return _conversation(rows[0])

    def list_conversations(self, include_deleted: bool = False) -> list[Conversation]:
        """Most recently updated first."""
        where = "" if include_deleted else "WHERE deleted IS NULL"
        rows = self._rows(f"SELECT * FROM conversations {where} ORDER BY updated DESC, id DESC")
        return [_conversation(row) for row in rows]

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
            changes["draft_settings"] = _dumps(draft_settings)
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
        return _message(rows[0])

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
        self.get_conversation(conversation_id)
        if parent_id is ACTIVE_LEAF:
            parent_id = self.active_leaf(conversation_id)
        elif parent_id is not None and self.get_message(parent_id).conversation_id != conversation_id:
            raise ValueError(f"message {parent_id} is not in conversation {conversation_id}")
        now = utc_now()
        with self.transaction() as db:
            message_id = (
                db["messages"]
                .insert(
                    {
                        "conversation_id": conversation_id,
                        "parent_id": parent_id,
                        "role": role,
                        "content": content,
                        "created": now,
                        "status": status,
                        "token_count": token_count,
                        "stats": None if stats is None else _dumps(stats),
                        "selected": self._next_selected(conversation_id),
                    }
                )
                .last_pk
            )
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
                (text, status, token_count, None if merged is None else _dumps(merged), message_id),
            )
            db.execute(
                "UPDATE conversations SET updated = ? WHERE id = ?", (utc_now(), message.conversation_id)
            )

    def set_message_stats(self, message_id: int, stats: dict | None) -> None:
        """Replace a message's generation stats."""
        with self.transaction() as db:
            db.execute(
                "UPDATE messages SET stats = ? WHERE id = ?",
                (None if stats is None else _dumps(stats), message_id),
            )

    # --- branches ----------------------------------------------------------------------------------

    def thread(self, conversation_id: int) -> list[Message]:
        """The visible thread: root first, ending at the most recently selected leaf."""
        leaf = self.active_leaf(conversation_id)
        if leaf is None:
            return []
        rows = self._rows(
            """
            WITH RECURSIVE path(id, depth) AS (
                SELECT ?, 0
                UNION ALL
                SELECT m.parent_id, path.depth + 1 FROM messages m JOIN path ON m.id = path.id
                WHERE m.parent_id IS NOT NULL
            )
            SELECT messages.* FROM messages JOIN path USING (id) ORDER BY path.depth DESC
            """,
            (leaf,),
        )
        return [_message(row) for row in rows]

    def siblings(self, message_id: int) -> list[Message]:
        """The alternatives to a message (itself included), oldest first: its edits or regenerations."""
        message = self.get_message(message_id)
        rows = self._rows(
            "SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY id",
            (message.conversation_id, message.parent_id),
        )
        return [_message(row) for row in rows]

    def switch_branch(self, message_id: int) -> list[Message]:
        """Make `message_id` visible, continuing to the leaf below it that was selected last.

        Returns the new visible thread.
        """
        message = self.get_message(message_id)
        rows = self._rows(
            """
            WITH RECURSIVE below(id) AS (
                SELECT ? UNION ALL SELECT m.id FROM messages m JOIN below ON m.parent_id = below.id
            )
            SELECT messages.id FROM messages JOIN below USING (id) ORDER BY selected DESC, id DESC LIMIT 1
            """,
            (message_id,),
        )
        leaf = rows[0]["id"]
        with self.transaction() as db:
            db.execute(
                "UPDATE messages SET selected = ? WHERE id = ?",
                (self._next_selected(message.conversation_id), leaf),
            )
        return self.thread(message.conversation_id)

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
                (key, _dumps(value)),
            )

    # --- snapshots: the unit of export, import and duplicate ---------------------------------------

    def snapshot(self, conversation_id: int) -> dict:
        """One conversation with every branch, as plain JSON-ready data (see store_export)."""
        conversation = self.get_conversation(conversation_id)
        messages = self._rows(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        )
        return {
            "conversation": {
                "id": conversation.id,
                "title": conversation.title,
                "created": conversation.created,
                "updated": conversation.updated,
                "target_model": conversation.target_model,
                "draft_settings": conversation.draft_settings,
                "system_prompt": conversation.system_prompt,
            },
            "messages": [
                {
                    "id": m.id,
                    "parent_id": m.parent_id,
                    "role": m.role,
                    "content": m.content,
                    "created": m.created,
                    "status": m.status,
                    "token_count": m.token_count,
                    "stats": m.stats,
                    "selected": m.selected,
                }
                for m in map(_message, messages)
            ],
        }

    def insert_snapshot(self, snapshot: dict, keep_ids: bool = True) -> int:
        """Insert a snapshot as a new conversation; returns its id.

        With keep_ids, the snapshot's ids are reused when none of them is taken (an import into an
        empty database is then exact); otherwise fresh ids are given and the tree is kept. A reply
        that was streaming when the snapshot was taken comes back 'interrupted'.
        """
        try:
            conversation = dict(snapshot["conversation"])
            for key in ("id", "title", "created", "updated", "target_model", "system_prompt"):
                if not isinstance(conversation[key], int if key == "id" else str):
                    raise ValueError(f"conversation {key} has the wrong type")
            if not isinstance(conversation["draft_settings"], dict):
                raise ValueError("draft_settings is not an object")
            messages = sorted(snapshot["messages"], key=lambda m: m["id"])
            for m in messages:
                if m["role"] not in ROLES or m["status"] not in STATUSES:
                    raise ValueError(f"message {m['id']}: unknown role or status")
                if not (isinstance(m["content"], str) and isinstance(m["created"], str)):
                    raise ValueError(f"message {m['id']}: content and created must be text")
                missing = {"parent_id", "token_count", "stats", "selected"} - m.keys()
                if missing:
                    raise ValueError(f"message {m['id']}: missing {sorted(missing)}")
            ids = [m["id"] for m in messages]
            if len(set(ids)) != len(ids) or any(
                m["parent_id"] is not None and m["parent_id"] not in ids for m in messages
            ):
                raise ValueError("message ids repeat or a parent is missing")
        except (KeyError, TypeError, ValueError) as exc:
            raise ImportFormatError(f"Not a Tandem conversation: {exc!r}") from exc

        with self.transaction() as db:
            if keep_ids:
                taken = db.execute(
                    "SELECT (SELECT count(*) FROM conversations WHERE id = ?) + "
                    f"(SELECT count(*) FROM messages WHERE id IN ({','.join('?' * len(ids))}))",
                    (conversation["id"], *ids),
                ).fetchone()[0]
                keep_ids = taken == 0
            row = {
                key: conversation[key]
                for key in ("title", "created", "updated", "target_model", "system_prompt")
            }
            row["draft_settings"] = _dumps(conversation["draft_settings"])
            if keep_ids:
                row["id"] = conversation["id"]
            conversation_id = db["conversations"].insert(row).last_pk
            new_ids: dict[int, int] = {}
            for m in messages:  # ascending ids: a parent always comes before its replies
                if m["parent_id"] is not None and m["parent_id"] not in new_ids:
                    raise ImportFormatError(f"Message {m['id']} comes before its parent {m['parent_id']}.")
                row = {
                    "conversation_id": conversation_id,
                    "parent_id": None if m["parent_id"] is None else new_ids[m["parent_id"]],
                    "role": m["role"],
                    "content": m["content"],
                    "created": m["created"],
                    "status": "interrupted" if m["status"] == "streaming" else m["status"],
                    "token_count": m["token_count"],
                    "stats": None if m["stats"] is None else _dumps(m["stats"]),
                    "selected": m["selected"],
                }
                if keep_ids:
                    row["id"] = m["id"]
                new_ids[m["id"]] = db["messages"].insert(row).last_pk
        return conversation_id


class ThrottledUpdater:
    """Collects a streaming reply and commits it to the store at most every `interval` seconds.

    Text not yet committed was always appended less than `interval` ago (plus the piece that triggered
    a commit still in progress), which bounds what a crash can lose. Use from the thread that owns the
    store: the GUI side of the bridge, never the engine thread.
    """

    def __init__(
        self,
        store: Store,
        message_id: int,
        interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.message_id = message_id
        self.interval = interval
        self._clock = clock
        self._pieces: list[str] = []
        self._last_commit = clock()
        self.committed_chars = 0

    @property
    def text(self) -> str:
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def append(self, piece: str) -> bool:
        """Add streamed text; returns True when this call committed."""
        self._pieces.append(piece)
        if self._clock() - self._last_commit >= self.interval:
            self.flush()
            return True
        return False

    def flush(self) -> None:
        self._last_commit = self._clock()
        text = self.text
        self.store.update_streaming(self.message_id, text)
        self.committed_chars = len(text)

    def finish(
        self, status: str = "complete", stats: dict | None = None, token_count: int | None = None
    ) -> None:
        self.store.finish_message(
            self.message_id, status, text=self.text, stats=stats, token_count=token_count
        )
        self.committed_chars = len(self.text)
