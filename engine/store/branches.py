"""Branch queries: the visible thread, a message's alternatives, and switching between them.

Store.thread, Store.siblings and Store.switch_branch call these (see database.py on branches).

`store` is a Store (not imported here: database.py imports this module).
"""

from __future__ import annotations

from engine.store.records import Message, message_from_row


def thread(store, conversation_id: int) -> list[Message]:
    """The visible thread: root first, ending at the most recently selected leaf."""
    leaf = store.active_leaf(conversation_id)
    if leaf is None:
        return []
    rows = store._rows(
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
    return [message_from_row(row) for row in rows]


def siblings(store, message_id: int) -> list[Message]:
    """The alternatives to a message (itself included), oldest first: its edits or regenerations."""
    message = store.get_message(message_id)
    rows = store._rows(
        "SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY id",
        (message.conversation_id, message.parent_id),
    )
    return [message_from_row(row) for row in rows]


def switch_branch(store, message_id: int) -> list[Message]:
    """Make `message_id` visible, continuing to the leaf below it that was selected last.

    Returns the new visible thread.
    """
    message = store.get_message(message_id)
    rows = store._rows(
        """
        WITH RECURSIVE below(id) AS (
            SELECT ? UNION ALL SELECT m.id FROM messages m JOIN below ON m.parent_id = below.id
        )
        SELECT messages.id FROM messages JOIN below USING (id) ORDER BY selected DESC, id DESC LIMIT 1
        """,
        (message_id,),
    )
    leaf = rows[0]["id"]
    with store.transaction() as db:
        db.execute(
            "UPDATE messages SET selected = ? WHERE id = ?",
            (store._next_selected(message.conversation_id), leaf),
        )
    return store.thread(message.conversation_id)
