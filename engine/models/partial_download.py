"""A hub file downloaded into a partial file that outlives a cancel or a killed process, so the next
download of the same file continues it with a Range request.

The partial file lies in Tandem's model cache, `hub-gguf-partial/<owner--repo--file>/<identity>.part`,
where the identity is the file's SHA-256 (or the hub's ETag when it lists none): a changed upstream
file has another identity, so its download starts over instead of continuing the old file's bytes,
and the old partial file is deleted. A lock beside it keeps a second Tandem from writing to it at the
same time. A dropped connection is resumed from the bytes on disk a few times before it is an error.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from engine.errors import TandemError
from engine.models.hub import network_errors
from engine.paths import models_cache_dir

FOLDER = "hub-gguf-partial"
CHUNK = 1024 * 1024
TRIES = 5  # tries in a row that bring no byte before a dropped connection is an error
RETRY_WAIT_S = 1.0


def partial_path(repo: str, filename: str, identity: str) -> Path:
    """Where the partial file of `filename` in `repo` with this identity (SHA-256 or ETag) is kept."""
    folder = models_cache_dir() / FOLDER / _plain(f"{repo}/{filename}".replace("/", "--"))
    return folder / f"{_plain(identity)}.part"


def _plain(text: str) -> str:
    return re.sub(r"[^\w.-]", "-", text)


class PartialLock:
    """Holds the partial file's folder for one download; another holder is a TandemError at once."""

    def __init__(self, part: Path, name: str) -> None:
        from filelock import FileLock

        part.parent.mkdir(parents=True, exist_ok=True)
        self._lock, self._name = FileLock(part.parent / "lock", timeout=0), name

    def __enter__(self) -> PartialLock:
        from filelock import Timeout

        try:
            self._lock.acquire()
        except Timeout as exc:
            raise TandemError(
                f"{self._name} is being downloaded already (by this or another Tandem); wait for it to finish."
            ) from exc
        except NotImplementedError:
            pass  # a file system without locks: one download at a time is then the user's to keep
        return self

    def __exit__(self, *exc_info) -> None:
        if self._lock.is_locked:
            self._lock.release()


def drop_other_versions(part: Path) -> None:
    """Delete the partial files of the same repository file that have another identity."""
    for other in part.parent.glob("*.part"):
        if other != part:
            other.unlink(missing_ok=True)


def fetch(url: str, part: Path, size: int | None, report: Callable[[int, int], None]) -> None:
    """Bring `part` up to the whole file at `url` (`size` bytes when known), continuing from the bytes
    it holds. `report(done, total)` runs before the request and after every chunk; what it raises
    (a cancel) stops the download and keeps the bytes written so far."""
    from huggingface_hub.errors import HfHubHTTPError

    if size is not None and part.exists() and part.stat().st_size > size:
        part.unlink()  # longer than the file: not a part of it
    tries = 0
    while True:
        before = _size(part)
        report(before, size or 0)
        if size is not None and before == size:
            return
        try:
            if _continue(url, part, before, size, report):
                return
            failure = None  # the answer ended early without an error
        except HfHubHTTPError:
            raise
        except network_errors() as exc:
            failure = exc
        tries = 0 if _size(part) > before else tries + 1
        if tries >= TRIES:
            raise failure or OSError(f"The hub's answers for {url} keep ending early.")
        if tries:
            time.sleep(RETRY_WAIT_S)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _continue(url: str, part: Path, start: int, size: int | None, report) -> bool:
    """One GET from byte `start`; True once the file is whole (or the server says nothing is left)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    # The Authorization header goes to the hub only: httpx drops it on a redirect to another host (the CDN).
    headers = {**build_hf_headers(), "Accept-Encoding": "identity"}
    if start:
        headers["Range"] = f"bytes={start}-"
    timeout = constants.HF_HUB_DOWNLOAD_TIMEOUT
    with get_session().stream(
        "GET", url, headers=headers, follow_redirects=True, timeout=timeout
    ) as response:
        if start and response.status_code == 416:
            return True  # the partial file holds every byte already; the checksum says whether they are right
        hf_raise_for_status(response)
        if response.status_code == 206:
            content_range = response.headers.get("Content-Range", "")
            if not content_range.startswith(f"bytes {start}-"):
                raise TandemError(f"The hub answered bytes {content_range!r} when asked for {start} onwards.")
            mode = "ab"
        else:
            start, mode = 0, "wb"  # the whole file: the server ignored the Range
        total = size or int(response.headers.get("Content-Length") or 0) + start
        done = start
        with part.open(mode) as handle:
            for chunk in response.iter_bytes(CHUNK):
                handle.write(chunk)
                done += len(chunk)
                report(done, total)
    return size is None or done >= size


def place(part: Path, destination: Path) -> None:
    """Move the finished partial file to `destination`, copying it when they lie on different disks."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(part, destination)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        staged = destination.with_name(destination.name + ".placing")
        shutil.copyfile(part, staged)
        os.replace(staged, destination)
        part.unlink()
