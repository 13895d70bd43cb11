"""The store's schema, its migrations, and how SQLite failures become errors a user can act on.

Tables (schema version SCHEMA_VERSION, kept in PRAGMA user_version):
  conversations  id, title, created, updated, target_model, draft_settings (JSON), system_prompt, deleted
  messages       id, conversation_id, parent_id, role, content, created, status, token_count,
                 stats (JSON), selected, writer
  settings       key, value (JSON)
  messages_fts   FTS5 index over messages.content, kept in sync by triggers

`messages.writer` is the lock slot of the process writing a 'streaming' reply (see locks.py); a
reopened store recovers only the rows whose writer is gone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import sqlite_utils

from engine.errors import (
    CorruptDatabaseError,
    DatabaseLockedError,
    DiskFullError,
    ReadOnlyStorageError,
    SchemaTooNewError,
    StorageError,
)

# ---------------------------------------------------------------------------------------------------
# Migrations. MIGRATIONS[i] takes a database at version i to version i + 1; never edit one that has
# shipped, add a new one.


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


def _v3_writer(db: sqlite_utils.Database) -> None:
    """A streaming reply names its writer, so opening the store recovers only replies whose writer died."""
    db.execute("ALTER TABLE messages ADD COLUMN writer INTEGER")


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_v1_initial, _v2_branches, _v3_writer]
SCHEMA_VERSION = len(MIGRATIONS)


def user_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


WRITE_POLL_S = 0.001


def begin_immediate(conn: sqlite3.Connection, sleep: Callable[[float], None] = time.sleep) -> None:
    """BEGIN IMMEDIATE, waiting for another writer up to the connection's busy timeout.

    SQLite's own busy handler sleeps up to 100 ms between tries, so a writer waiting on another
    process's run of short transactions can miss every short gap between them and wait out the whole
    run, or time out. Trying every millisecond takes one of the first gaps.
    """
    timeout_ms = conn.execute("PRAGMA busy_timeout").fetchone()[0]
    deadline = time.monotonic() + timeout_ms / 1000
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
                if code not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or time.monotonic() >= deadline:
                    raise
            sleep(WRITE_POLL_S)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")


def migrate(db: sqlite_utils.Database, target: int = SCHEMA_VERSION) -> None:
    """Run the migrations from the database's version up to `target`, each in its own transaction.

    The version is read inside the write transaction, so two processes opening a new database at
    the same moment run each migration once: the second waits, then finds it done.
    """
    while True:
        begin_immediate(db.conn)
        try:
            version = user_version(db.conn)
            if version >= target:
                db.execute("COMMIT")
                return
            MIGRATIONS[version](db)
            db.execute(f"PRAGMA user_version = {version + 1}")
            db.execute("COMMIT")
        except BaseException:
            if db.conn.in_transaction:
                db.execute("ROLLBACK")
            raise


# ---------------------------------------------------------------------------------------------------
# Errors: the environment's fault (shown to the user) versus bugs (raised as they are).

LOW_SPACE_BYTES = 1 << 20  # below this much free space, an I/O failure is taken as a full disk


def disk_is_full(path: Path) -> bool:
    try:  # is_dir() too: a folder this user may not enter raises PermissionError
        folder = path if path.is_dir() else path.parent
        return shutil.disk_usage(folder).free < LOW_SPACE_BYTES
    except OSError:
        return False


def disk_full_error(path: Path) -> DiskFullError:
    return DiskFullError(f"The disk holding {path} is full: free space and retry.")


def storage_error(exc: sqlite3.Error, path: Path) -> StorageError | None:
    """The typed, readable error for an SQLite failure the user can act on; None for a bug."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if code is not None else None
    if primary == sqlite3.SQLITE_FULL:
        return disk_full_error(path)
    if primary in (sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN) and disk_is_full(path):
        # A full disk often surfaces as an I/O error: the -wal or -shm file could not grow.
        return disk_full_error(path)
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
        return DatabaseLockedError(
            f"{path} stayed busy: another program, perhaps a second Tandem, kept it locked. Try again."
        )
    if primary == sqlite3.SQLITE_IOERR:
        return StorageError(f"Reading or writing {path} failed (disk I/O error): {exc}")
    return None


def os_storage_error(exc: OSError, path: Path, doing: str) -> StorageError:
    """The readable error for a failed file operation next to the database."""
    if exc.errno == errno.ENOSPC or disk_is_full(path):
        return disk_full_error(path)
    return ReadOnlyStorageError(f"Cannot {doing} {path}: {exc.strerror}.")


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
# Opening


def prepare(conn: sqlite3.Connection, path: Path) -> sqlite_utils.Database:
    """Check, configure and migrate a freshly opened connection; the Database around it.

    A database too new for this version, or damaged, is refused before anything writes to it.
    """
    with translated_errors(path):
        version = user_version(conn)
        if version > SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"{path} was written by a newer version of Tandem (schema {version}; this version "
                f"reads up to {SCHEMA_VERSION}). Update Tandem; the file has not been changed.",
                path,
                version,
                SCHEMA_VERSION,
            )
        if version > 0:
            problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise CorruptDatabaseError(
                    f"{path} is damaged ({problems[0]}). It can be moved aside (kept, not deleted) "
                    "and a fresh one started.",
                    path,
                )
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        db = sqlite_utils.Database(conn)
        if 0 < version < SCHEMA_VERSION:
            _backup(conn, path, version)
        migrate(db)
    return db


def check_writable(conn: sqlite3.Connection, path: Path) -> None:
    """Raise the store's error now if the database cannot be written (a read-only file, folder or
    disk), rather than at its first real write: a write of the header that is rolled back."""
    with translated_errors(path):
        begin_immediate(conn)
        try:
            conn.execute(f"PRAGMA user_version = {user_version(conn)}")
        finally:
            conn.execute("ROLLBACK")


def remove_empty(path: Path) -> None:
    """Remove a database file that holds nothing (0 bytes, as a create that failed on a full disk
    leaves it), with its -wal and -shm; a file with anything in it is left alone."""
    try:
        if path.stat().st_size != 0:
            return
        for name in (path.name + "-wal", path.name + "-shm", path.name):
            path.with_name(name).unlink(missing_ok=True)
    except OSError:
        pass  # it stays; the next open creates the database in it


def _backup(conn: sqlite3.Connection, path: Path, version: int) -> None:
    """Copy an old database before migrating it, once per version: <name>.v<version>.bak."""
    target = path.with_name(f"{path.name}.v{version}.bak")
    if target.exists():
        return
    copy = sqlite3.connect(target)
    try:
        conn.backup(copy)
    finally:
        copy.close()


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
        raise os_storage_error(exc, path, "move aside") from exc
    return target
