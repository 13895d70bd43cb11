"""The reply being generated: where it goes in the store, and what has arrived so far.

The ThrottledUpdater commits the streaming text on its own thread; when the store cannot be written
(disk full, read-only, locked) the text stays here, in memory, and `unsaved` keeps the final record
until a later write succeeds.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.markdown_render import encode_provenance
from engine.store.streaming import ThrottledUpdater

UPDATE_INTERVAL_S = 0.5


class Reply:
    def __init__(self, store, conversation_id: int, message_id: int, meta: dict):
        self.conversation_id = conversation_id
        self.message_id = message_id
        self.meta = meta
        self.updater = ThrottledUpdater(store, message_id, interval=UPDATE_INTERVAL_S)
        self.spans: list[tuple[str, str]] = []
        self.last_stats = None
        self.stopping = False
        self.history: list[dict] = []  # the messages it answers, as sent to the engine

    def provenance(self) -> dict:
        counts = {"draft": 0, "target": 0, "bonus": 0}
        for _, provenance in self.spans:
            counts[provenance] = counts.get(provenance, 0) + 1
        return {"provenance_counts": counts, "provenance_runs": encode_provenance(self.spans)}


@dataclass
class UnsavedReply:
    """A finished reply the store refused; shown from memory and written at the next chance."""

    updater: ThrottledUpdater
    status: str
    text: str
    record: dict
    token_count: int | None

    def save(self) -> None:
        self.updater.finish(self.status, stats=self.record, token_count=self.token_count)
