"""The store's records: plain frozen dataclasses read from rows, and the text rules they follow.

Timestamps are ISO 8601 UTC strings with microseconds, "2024-05-01T12:00:00.000000Z": fixed width, so
they sort as text.

Text: SQLite holds valid Unicode only. A Python str with a lone surrogate (U+D800..U+DFFF) has no
UTF-8 form; check_text refuses it with a readable error. Every other string round-trips exactly.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from engine.errors import InvalidTextError

ROLES = ("system", "user", "assistant")
STATUSES = ("complete", "streaming", "cancelled", "error", "interrupted")
# "interrupted" is also how a reply ends whose server stream broke off mid-reply (engine.remote)
FINAL_STATUSES = ("complete", "cancelled", "error", "interrupted")


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def check_text(text: str, what: str = "The message") -> str:
    """`text` itself when SQLite can store it; InvalidTextError naming the first bad character."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidTextError(
            f"{what} holds a character that is not valid Unicode (U+{ord(text[exc.start]):04X} at "
            f"position {exc.start}), so it cannot be stored."
        ) from None
    return text


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


def conversation_from_row(row: sqlite3.Row) -> Conversation:
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


def message_from_row(row: sqlite3.Row) -> Message:
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
