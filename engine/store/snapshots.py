"""Snapshots: one conversation with every branch as plain JSON-ready data.

The unit of export, import and duplicate. Store.snapshot and Store.insert_snapshot call these.

`store` is a Store (not imported here: database.py imports this module).
"""

from __future__ import annotations

from engine.errors import ImportFormatError
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


def _validated(snapshot: dict) -> tuple[dict, list[dict]]:
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
            check_text(m["content"], f"Message {m['id']}")
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
