"""Which process owns a database, and which processes are still writing to it.

One lock file sits beside the database, `<name>.lock`, and holds byte-range locks:
  byte 0        the instance lock: the one app or terminal chat that owns the database
                (Store.acquire_instance_lock). A second one is told the database is in use.
  byte `slot`   a writer's liveness lock (slot in 1..2**31), taken at its first streaming reply and
                held until the process ends. The reply's row records the slot, so a store opened
                later marks 'interrupted' only the replies whose writer is gone.
The operating system drops every lock of a process that ends, kill -9 and power loss included, so a
lock can never be left behind. POSIX locks belong to the process and are dropped when any descriptor
of the file closes, so each process keeps one descriptor per lock file, here, for its lifetime.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

INSTANCE_BYTE = 0
SLOTS = 2**31


def lock_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".lock")


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _try_lock(fd: int, offset: int, exclusive: bool = True) -> bool:
        os.lseek(fd, offset, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int, offset: int) -> None:
        os.lseek(fd, offset, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _try_lock(fd: int, offset: int, exclusive: bool = True) -> bool:
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        try:
            fcntl.lockf(fd, mode, 1, offset, os.SEEK_SET)
        except OSError:  # EAGAIN / EACCES: another process holds it
            return False
        return True

    def _unlock(fd: int, offset: int) -> None:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset, os.SEEK_SET)


@dataclass
class _LockFile:
    fd: int
    writable: bool
    slot: int | None = None  # this process's writer slot
    instance_owner: object | None = None  # the Store holding the instance lock in this process
    guard: threading.Lock = field(default_factory=threading.Lock)


_files: dict[str, _LockFile] = {}
_files_guard = threading.Lock()


def _open(db_path: Path, create: bool) -> _LockFile | None:
    """This process's descriptor of the lock file; None when it does not exist and cannot be made."""
    path = lock_path(db_path)
    key = os.path.realpath(path)
    with _files_guard:
        found = _files.get(key)
        if found is not None and (found.writable or not create):
            return found
        try:
            fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
            writable = True
        except OSError:
            try:
                fd = os.open(path, os.O_RDONLY)
                writable = False
            except OSError:
                return found
        if found is not None:  # upgrade a read-only descriptor: it holds no locks, so closing is safe
            os.close(found.fd)
        _files[key] = _LockFile(fd, writable)
        return _files[key]


def writer_slot(db_path: Path) -> int | None:
    """This process's writer slot for the database, locked for the life of the process.

    None when no lock file can be written beside the database; replies written then are recovered
    by whoever opens the store next, as before writers were recorded.
    """
    lock = _open(db_path, create=True)
    if lock is None or not lock.writable:
        return None
    with lock.guard:
        while lock.slot is None:
            slot = 1 + secrets.randbelow(SLOTS - 1)
            if _try_lock(lock.fd, slot):
                lock.slot = slot
        return lock.slot


def writer_alive(db_path: Path, slot: int) -> bool:
    """Whether the process that took `slot` still runs."""
    lock = _open(db_path, create=False)
    if lock is None:
        return False  # no lock file: nobody can hold a slot
    with lock.guard:
        if slot == lock.slot:
            return True
        if _try_lock(lock.fd, slot, exclusive=lock.writable):
            _unlock(lock.fd, slot)
            return False
        return True


def acquire_instance(db_path: Path, owner: object) -> bool:
    """Take the instance lock for `owner`; False when another process or Store holds it."""
    lock = _open(db_path, create=True)
    if lock is None or not lock.writable:
        return True  # nothing beside the database can be written: the store itself will refuse writes
    with lock.guard:
        if lock.instance_owner is owner:
            return True
        if lock.instance_owner is not None or not _try_lock(lock.fd, INSTANCE_BYTE):
            return False
        lock.instance_owner = owner
        return True


def release_instance(db_path: Path, owner: object) -> None:
    lock = _open(db_path, create=False)
    if lock is None:
        return
    with lock.guard:
        if lock.instance_owner is owner:
            _unlock(lock.fd, INSTANCE_BYTE)
            lock.instance_owner = None
