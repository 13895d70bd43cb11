"""Saving a reply while it streams: ThrottledUpdater, used the same way by the app and the terminal chat."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.errors import StorageError, TandemError
from engine.store.records import check_text
from engine.store.schema import begin_immediate, translated_errors

if TYPE_CHECKING:
    from engine.store.database import Store


class ThrottledUpdater:
    """Collects a streaming reply and commits it to its 'streaming' row in the store.

    The promise, kept by a thread of the updater's own (the caller needs no timer): text not yet
    committed arrived less than `interval` ago, so a crash or kill -9 loses at most the last
    `interval` of output. Commits come about every `interval` while text arrives, none when none does.
    The only exception is a commit that cannot happen: the disk is full or another program holds
    the database. The text then stays in memory, `error` holds the readable StorageError, and the
    commit is retried every `interval` until it succeeds or finish() is called.

    The thread writes on its own connection, so the caller's thread never waits on a commit.
    append(), flush() and `text` are safe from any thread; finish() runs on the thread that owns `store`.
    """

    def __init__(
        self,
        store: Store,
        message_id: int,
        interval: float = 0.5,
        on_commit: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.message_id = message_id
        self.interval = interval
        self.on_commit = on_commit  # called on the updater's thread with the characters committed
        self._clock = clock  # seconds, for when text arrived and when a commit is due (tests set their own)
        self.committed_chars = 0
        self.error: StorageError | TandemError | None = None
        self._margin = min(0.05, interval / 10)  # the commit itself takes a little time
        self._cond = threading.Condition()
        self._pieces: list[str] = []
        self._length = 0
        self._oldest: float | None = None  # when the oldest uncommitted piece arrived
        self._retry_at = 0.0
        self._flush_requested = False
        self._failures = 0  # failed commits so far
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"reply-{message_id}-saver", daemon=True)
        self._thread.start()

    @property
    def text(self) -> str:
        with self._cond:
            return self._text()

    def _text(self) -> str:
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def append(self, piece: str) -> None:
        """Add streamed text; it is committed within `interval`."""
        if not piece:
            return
        with self._cond:
            self._pieces.append(piece)
            self._length += len(piece)
            if self._oldest is None:
                self._oldest = self._clock()
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Commit what has arrived now and wait for it; False if that attempt failed (see error)."""
        with self._cond:
            target, failures = self._length, self._failures
            self._flush_requested = True
            self._cond.notify_all()
            self._cond.wait_for(
                lambda: self.committed_chars >= target or self._failures > failures or self._stopped, timeout
            )
            return self.committed_chars >= target

    def finish(
        self, status: str = "complete", stats: dict | None = None, token_count: int | None = None
    ) -> None:
        """End the reply with its final status and full text. On a StorageError the text is kept and
        finish() can be called again."""
        self._stop()
        text = self.text
        self.store.finish_message(self.message_id, status, text=text, stats=stats, token_count=token_count)
        self.committed_chars = len(text)
        self.error = None

    def _stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    # --- the updater's thread -------------------------------------------------------------------

    def _due(self) -> float | None:
        """When the next commit should start; None while nothing waits."""
        if self._oldest is None:
            return None
        if self._flush_requested:  # asked for now: also retries at once after a failure
            return 0.0
        return max(self._oldest + self.interval - self._margin, self._retry_at)

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                with self._cond:
                    while not self._stopped:
                        due = self._due()
                        now = self._clock()
                        if due is not None and due <= now:
                            break
                        self._cond.wait(None if due is None else due - now)
                    if self._stopped:
                        return
                    text, oldest = self._text(), self._oldest
                    self._oldest, self._flush_requested = None, False
                try:
                    conn = conn or self._connect()
                    self._commit(conn, text)
                except TandemError as exc:  # a StorageError: disk full, read-only, locked
                    with self._cond:
                        self.error = exc
                        self._failures += 1
                        self._oldest = oldest  # still uncommitted, and older than anything since
                        self._retry_at = self._clock() + self.interval
                        self._cond.notify_all()
                    continue
                with self._cond:
                    self.committed_chars = len(text)
                    self.error = None
                    self._cond.notify_all()
                if self.on_commit is not None:
                    self.on_commit(len(text))
        finally:
            if conn is not None:
                conn.close()

    def _connect(self) -> sqlite3.Connection:
        with translated_errors(self.store.path):
            conn = sqlite3.connect(self.store.path, isolation_level=None, timeout=self.store.busy_timeout_s)
            conn.execute("PRAGMA synchronous = FULL")
        return conn

    def _commit(self, conn: sqlite3.Connection, text: str) -> None:
        check_text(text, "The reply")
        with translated_errors(self.store.path):
            begin_immediate(conn)
            try:
                conn.execute(
                    "UPDATE messages SET content = ? WHERE id = ? AND status = 'streaming'",
                    (text, self.message_id),
                )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
