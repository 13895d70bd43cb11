"""Snapshots: one conversation with every branch as plain JSON-ready data.

The unit of export, import and duplicate. Store.snapshot and Store.insert_snapshot call these.

`store` is a Store (not imported here: database.py imports this module).
"""

from __future__ import annotations

from collections import Counter

from engine.errors import ImportFormatError, InvalidTextError
from engine.store.records import ROLES, STATUSES, check_text, dumps, message_from_row


def take_snapshot(store, conversation_id: int) -> dict:
    conversation = store.get_conversation(conversation_id)
    rows = store._rows("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,))
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
            for m in map(message_from_row, rows)
        ],
    }


# the fields of a snapshot, each with the JSON types it may have (None: null)
CONVERSATION_FIELDS = {
    "id": int,
    "title": str,
    "created": str,
    "updated": str,
    "target_model": str,
    "system_prompt": str,
    "draft_settings": dict,
}
MESSAGE_FIELDS = {
    "id": int,
    "parent_id": (int, None),
    "role": str,
    "content": str,
    "created": str,
    "status": str,
    "token_count": (int, None),
    "stats": (dict, None),
    "selected": int,
}
STORED_AS_JSON = ("draft_settings", "stats")
KIND_NAMES = {int: "a whole number", str: "text", dict: "an object", list: "a list", None: "null"}


def _kind(value) -> str:
    for kind, name in KIND_NAMES.items():
        if (value is None) if kind is None else isinstance(value, kind):
            return name
    return "a number" if isinstance(value, float) else type(value).__name__


def _fields(record, fields: dict, where: str) -> None:
    """ImportFormatError, in words, unless `record` is an object with each of `fields` of its kind."""
    if not isinstance(record, dict):
        raise ImportFormatError(f"{where} should be an object, not {_kind(record)}.")
    for key, kinds in fields.items():
        if key not in record:
            raise ImportFormatError(f"{where} has no '{key}'.")
        allowed = kinds if isinstance(kinds, tuple) else (kinds,)
        if _kind(record[key]) not in (KIND_NAMES[kind] for kind in allowed):
            wanted = " or ".join(KIND_NAMES[kind] for kind in allowed)
            raise ImportFormatError(f"{where}: '{key}' should be {wanted}, not {_kind(record[key])}.")
        value = record[key]
        if not isinstance(value, str) and key not in STORED_AS_JSON:
            continue
        try:  # text SQLite can hold, also inside the objects stored as JSON
            check_text(value if isinstance(value, str) else dumps(value), f"{where}: '{key}'")
        except InvalidTextError as exc:
            raise ImportFormatError(str(exc)) from None
        except RecursionError:
            raise ImportFormatError(f"{where}: '{key}' nests too deeply.") from None


def _validated(snapshot) -> tuple[dict, list[dict]]:
    """The snapshot's conversation and its messages by id; ImportFormatError saying what is wrong."""
    _fields(snapshot, {"conversation": dict, "messages": list}, "Its entry")
    conversation = snapshot["conversation"]
    _fields(conversation, CONVERSATION_FIELDS, "Its 'conversation' part")
    for i, message in enumerate(snapshot["messages"]):
        _fields(message, {"id": int}, f"Message {i + 1} of {len(snapshot['messages'])}")
    messages = sorted(snapshot["messages"], key=lambda m: m["id"])
    ids = [m["id"] for m in messages]
    for m in messages:
        where = f"Message {m['id']}"
        _fields(m, MESSAGE_FIELDS, where)
        if m["role"] not in ROLES:
            raise ImportFormatError(
                f"{where} has the role '{m['role']}'; it should be one of {', '.join(ROLES)}."
            )
        if m["status"] not in STATUSES:
            raise ImportFormatError(
                f"{where} has the status '{m['status']}'; it should be one of {', '.join(STATUSES)}."
            )
        if m["parent_id"] is not None and m["parent_id"] not in ids:
            raise ImportFormatError(f"{where} answers message {m['parent_id']}, which is not in the file.")
    repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
    if repeated:
        raise ImportFormatError(f"Message id {repeated[0]} appears more than once.")
    return conversation, messages


def insert_snapshot(store, snapshot: dict, keep_ids: bool = True) -> int:
    """Insert a snapshot as a new conversation; returns its id.

    With keep_ids, the snapshot's ids are reused when none of them is taken (an import into an
    empty database is then exact); otherwise fresh ids are given and the tree is kept. A reply
    that was streaming when the snapshot was taken comes back 'interrupted'.
    """
    conversation, messages = _validated(snapshot)
    ids = [m["id"] for m in messages]
    with store.transaction() as db:
        if keep_ids:
            taken = db.execute(
                "SELECT (SELECT count(*) FROM conversations WHERE id = ?) + "
                f"(SELECT count(*) FROM messages WHERE id IN ({','.join('?' * len(ids))}))",
                (conversation["id"], *ids),
            ).fetchone()[0]
            keep_ids = taken == 0
        row = {
            key: conversation[key] for key in ("title", "created", "updated", "target_model", "system_prompt")
        }
        row["draft_settings"] = dumps(conversation["draft_settings"])
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
                "stats": None if m["stats"] is None else dumps(m["stats"]),
                "selected": m["selected"],
            }
            if keep_ids:
                row["id"] = m["id"]
            new_ids[m["id"]] = db["messages"].insert(row).last_pk
    return conversation_id
