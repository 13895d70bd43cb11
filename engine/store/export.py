"""Export conversations to JSON (every branch, exact) or Markdown (the visible thread, for reading),
and import the JSON back. Files are written atomically: a temporary file in the same folder, fsync,
then os.replace, so a crash leaves either the old file or the new one, never half of one.

The JSON file:
  {"format": "tandem-conversations", "version": 1, "exported": <timestamp>,
   "conversations": [Store.snapshot(...), ...]}
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

from engine.errors import DiskFullError, ImportFormatError, ReadOnlyStorageError, StorageError
from engine.stats import GenerationStats
from engine.store.database import Store, utc_now

FORMAT = "tandem-conversations"
FORMAT_VERSION = 1


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    tmp_name = None
    try:
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
        tmp_name = None
        _fsync_dir(path.parent)
    except OSError as exc:
        raise _os_error(exc, path) from exc
    finally:
        if tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
    return path


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); Windows cannot open folders, and needs no such step."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _os_error(exc: OSError, path: Path) -> StorageError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"The disk is full; {path} was not written. Free some space and try again.")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return ReadOnlyStorageError(f"{path} cannot be written here ({exc.strerror}). Choose another folder.")
    if exc.errno == errno.ENOENT:
        return StorageError(f"The folder for {path} does not exist.")
    return StorageError(f"Writing {path} failed: {exc.strerror or exc}.")


def _ids(store: Store, conversation_ids: Iterable[int] | None) -> list[int]:
    if conversation_ids is None:
        return [c.id for c in reversed(store.list_conversations())]  # oldest first
    return list(conversation_ids)


# --- JSON ------------------------------------------------------------------------------------------


def export_data(store: Store, conversation_ids: Iterable[int] | None = None) -> dict:
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "exported": utc_now(),
        "conversations": [store.snapshot(cid) for cid in _ids(store, conversation_ids)],
    }


def export_json(store: Store, path: str | os.PathLike, conversation_ids: Iterable[int] | None = None) -> Path:
    """Every branch, stats and timestamp of the given conversations (default: all visible ones)."""
    text = json.dumps(export_data(store, conversation_ids), ensure_ascii=False, indent=1)
    return atomic_write_text(path, text + "\n")


def import_data(store: Store, data: dict) -> list[int]:
    """Insert the conversations of an export; returns their ids. All or nothing."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ImportFormatError("This file is not a Tandem conversation export.")
    if not isinstance(data.get("version"), int) or data["version"] > FORMAT_VERSION:
        raise ImportFormatError(
            f"This export has format version {data.get('version')!r}; this Tandem reads up to "
            f"{FORMAT_VERSION}. Update Tandem to import it."
        )
    conversations = data.get("conversations", [])
    if not isinstance(conversations, list):
        raise ImportFormatError("Its 'conversations' should be a list of conversations.")
    ids = []
    with store.transaction():
        for number, snapshot in enumerate(conversations, 1):
            try:
                ids.append(store.insert_snapshot(snapshot))
            except ImportFormatError as exc:
                raise ImportFormatError(
                    f"Conversation {number} of {len(conversations)} is damaged. {exc}"
                ) from None
    return ids


def import_json(store: Store, path: str | os.PathLike) -> list[int]:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise StorageError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    except ValueError as exc:  # not UTF-8, not JSON, an integer past 4300 digits
        raise ImportFormatError(f"{path} is not a Tandem conversation export ({exc}).") from exc
    except RecursionError:
        raise ImportFormatError(
            f"{path} is not a Tandem conversation export (it nests too deeply)."
        ) from None
    try:
        return import_data(store, data)
    except ImportFormatError as exc:
        raise ImportFormatError(f"{path}: {exc}") from None


# --- Markdown --------------------------------------------------------------------------------------


def _stats_line(stats: dict) -> str:
    parts = []
    if stats.get("acceptance_rate") is not None:
        parts.append(f"acceptance {stats['acceptance_rate']:.0%}")
    if stats.get("mean_accepted_length") is not None:
        parts.append(f"{stats['mean_accepted_length']:.2f} tokens/round")
    speed = stats.get("decode_tokens_per_s", stats.get("tokens_per_s"))  # the figure the app shows
    if speed is not None:
        parts.append(f"{speed:.1f} tokens/s")
    claim = _speed_claim(stats)
    if claim:
        parts.append(claim)
    if stats.get("current_k"):
        parts.append(f"K={stats['current_k']}")
    if stats.get("drafter"):
        parts.append(f"drafter {stats['drafter']}")
    return ", ".join(parts)


def _speed_claim(stats: dict) -> str:
    """The speed-up as the app words it (GenerationStats.verdict), with its basis: an estimate or
    measured in this reply. A stored record judges itself; an older, partial one shows its figure."""
    names = {f.name for f in fields(GenerationStats)}
    if "drafted" in stats:
        record = GenerationStats(**{k: v for k, v in stats.items() if k in names})
        if record.verdict == "plain":
            return "decoded plainly"
        if record.verdict not in ("faster", "slower"):
            return ""
        speedup, estimate = record.speedup, record.speedup_is_estimate
    else:
        speedup, estimate = stats.get("speedup"), stats.get("speedup_is_estimate")
        if speedup is None:
            return ""
    basis = {True: " (estimate)", False: " (measured in this reply)"}.get(estimate, "")
    return f"{speedup:.2f}× speed-up vs the target alone{basis}"


def conversation_markdown(store: Store, conversation_id: int) -> str:
    """The visible thread, readable as a document. Other branches are only counted."""
    conversation = store.get_conversation(conversation_id)
    lines = [f"# {conversation.title}", ""]
    lines.append(f"- Created: {conversation.created}")
    if conversation.target_model:
        lines.append(f"- Model: {conversation.target_model}")
    if conversation.draft_settings:
        lines.append(f"- Drafting: {json.dumps(conversation.draft_settings, ensure_ascii=False)}")
    lines.append("")
    if conversation.system_prompt:
        lines += ["## System prompt", "", conversation.system_prompt, ""]
    for message in store.thread(conversation_id):
        heading = message.role.capitalize()
        if message.status != "complete":
            heading += f" ({message.status})"
        alternatives = len(store.siblings(message.id)) - 1
        if alternatives:
            heading += f" — {alternatives} other version{'s' if alternatives > 1 else ''} not shown"
        lines += [f"## {heading}", "", message.content, ""]
        summary = _stats_line(message.stats or {})
        if summary:
            lines += [f"*{summary}*", ""]
    return "\n".join(lines)


def export_markdown(
    store: Store, path: str | os.PathLike, conversation_ids: Iterable[int] | None = None
) -> Path:
    parts = [conversation_markdown(store, cid) for cid in _ids(store, conversation_ids)]
    return atomic_write_text(path, "\n---\n\n".join(parts))
