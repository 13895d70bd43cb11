"""The engine's events for the reply being written: pieces, round stats, the end, a failure.

A mixin of MainWindow (app/main_window.py). The final record is written through the window's storage
guard; a reply the store refuses stays in `window.unsaved` and on screen until a write succeeds.
"""

from __future__ import annotations

from app.qt import Slot
from app.reply import UnsavedReply


class ReplyEvents:
    # --- engine events --------------------------------------------------------------------------

    @Slot(object)
    def _on_piece(self, piece) -> None:
        reply = self.reply
        if reply is None:
            return
        spans = [(span.text, span.provenance) for span in piece.spans]
        reply.spans.extend(spans)
        reply.updater.append(piece.text)
        if reply.updater.error is not None and not self.storage_banner.isVisibleTo(self):
            self.storage_banner.show_error("save the reply as it arrives", reply.updater.error)
        if self.conversation_id == reply.conversation_id:
            self.chat_view.append_spans(spans)

    @Slot(object)
    def _on_round_stats(self, stats) -> None:
        if self.reply is not None:
            self.reply.last_stats = stats
            if self.conversation_id == self.reply.conversation_id:
                self.stats_panel.update_stats(stats)

    @Slot(object)
    def _on_finished(self, result) -> None:
        if self.reply is None:
            return
        status = "cancelled" if result.reason == "cancelled" else "complete"
        self._finish_reply(status, result.stats, result, text=result.text or None)

    @Slot(str, str)
    def _on_failed(self, message: str, details: str) -> None:
        if self.reply is None:
            return
        self._finish_reply("error", self.reply.last_stats, None, error=(message, details))

    def _finish_reply(self, status: str, stats, result, text: str | None = None, error=None) -> None:
        reply, self.reply = self.reply, None
        record = {**reply.meta, **(stats.to_dict() if stats is not None else {}), **reply.provenance()}
        if result is not None:
            record["finish_reason"] = result.reason
        if error is not None:
            record["error"], record["error_details"] = error
        streamed = reply.updater.text
        if text and text.startswith(streamed) and text != streamed:
            reply.updater.append(text[len(streamed) :])
        final_text = reply.updater.text
        token_count = len(result.token_ids) if result is not None else len(reply.spans)
        unsaved = UnsavedReply(reply.updater, status, final_text, record, token_count)
        ok, _ = self.write("save the reply", unsaved.save)
        if not ok:
            self.unsaved[reply.message_id] = unsaved
        if self.conversation_id == reply.conversation_id:
            self.chat_view.finish_streaming(final_text, status, record)
            if stats is not None:
                self.stats_panel.update_stats(stats, caption="The reply just written")
                self.chat_view.select_message(reply.message_id)
        self.sidebar.refresh()
        self.activity_label.setText(
            {"complete": "Ready", "cancelled": "Stopped", "error": "Reply failed"}[status]
        )
        self._update_controls()
        self.reply_finished.emit(status)

    @Slot()
    def save_unsaved(self) -> bool:
        """Write the replies the store refused earlier; True when nothing is left unsaved."""
        for message_id, unsaved in list(self.unsaved.items()):
            ok, _ = self.write("save the reply", unsaved.save)
            if not ok:
                return False
            del self.unsaved[message_id]
        if not self.unsaved:
            self.storage_banner.hide()
        return True
