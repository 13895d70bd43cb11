"""The window's reply controller: starting a reply, the engine's events while it is written, its end.

It owns the reply being written (app/reply.py), the replies the store refused (kept on screen and
saved at the next chance), and a reply asked for before any model has loaded: that one waits visibly
in the chat and starts the moment the engine answers. After a conversation's first exchange it asks
the model for a title (app/titles.py). Store writes go through the window's storage guard.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.qt import QObject, QtCore, Signal, Slot
from app.reply import Reply, UnsavedReply
from app.titles import clean_title, first_message_title

WAITING_ID = 0  # the id of the placeholder for a reply that waits for the model (store ids start at 1)


@dataclass
class PendingReply:
    """A reply asked for before the engine was ready."""

    conversation_id: int
    parent_id: int | None  # None: the end of the visible thread


class ReplyController(QObject):
    """Bound to one MainWindow: its store, bridge, chat view, stats panel, sidebar and labels."""

    finished = Signal(str)  # final status of a reply: complete, cancelled or error

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.bridge = window.bridge
        self.reply: Reply | None = None
        self.pending: PendingReply | None = None
        self.unsaved: dict[int, UnsavedReply] = {}  # finished replies the store refused, by message id
        worker = self.bridge.worker
        worker.reading.connect(self._on_reading)
        worker.piece.connect(self._on_piece)
        worker.round_stats.connect(self._on_round_stats)
        worker.finished.connect(self._on_finished)
        worker.failed.connect(self._on_failed)
        worker.titled.connect(self._on_titled)

    @property
    def busy(self) -> bool:
        """A reply is being written or waits for the model."""
        return self.reply is not None or self.pending is not None

    # --- starting --------------------------------------------------------------------------------

    def start(self, conversation_id: int, parent_id: int | None = None) -> bool:
        """Answer the end of the visible thread (or `parent_id`): now, or once the model has loaded.
        False when no model is loaded or loading."""
        if self.bridge.info is not None:
            self._begin(conversation_id, parent_id)
            return True
        if not self.bridge.loading:
            self.window.activity_label.setText("Load a model first: open Settings (Ctrl+,)")
            return False
        self.pending = PendingReply(conversation_id, parent_id)
        self.window.show_thread()
        self.window.sidebar.refresh(select_id=conversation_id)
        self.window.update_controls()
        return True

    @Slot(object)
    def engine_ready(self, _info) -> None:
        pending, self.pending = self.pending, None
        if pending is not None and self.reply is None:
            self._begin(pending.conversation_id, pending.parent_id)

    @Slot(str)
    def engine_unavailable(self, why: str) -> None:
        """No engine to answer a waiting reply: the question stays, with an Answer button."""
        if self.pending is not None and self.bridge.info is None:
            self.pending = None
            self.window.show_thread()
            self.window.statusBar().showMessage(f"{why} Your message is kept: Answer sends it again.", 10000)
            self.window.update_controls()

    def _begin(self, conversation_id: int, parent_id: int | None) -> None:
        window, store = self.window, self.window.store
        thread = store.thread(conversation_id)
        if parent_id is not None:  # regenerating: the history ends at the message being answered
            ids = [m.id for m in thread]
            thread = thread[: ids.index(parent_id) + 1]
        conversation = store.get_conversation(conversation_id)
        prompt = conversation.system_prompt or window.config.system_prompt
        history = [{"role": "system", "content": prompt}] if prompt else []
        history += history_of(thread)
        info = self.bridge.info
        meta = {
            "target": info.target,
            "draft": info.draft,
            "quantization": info.quantization,
            "device": info.device,
        }
        parent = parent_id if parent_id is not None else thread[-1].id
        ok, message_id = window.write(
            "start the reply", lambda: store.begin_assistant(conversation_id, parent_id=parent, meta=meta)
        )
        if not ok:
            window.show_thread()
            return
        self.reply = Reply(store, conversation_id, message_id, meta)
        self.reply.history = history
        window.show_thread()
        window.sidebar.refresh(select_id=conversation_id)
        window.stats_panel.reset()
        self.bridge.respond(history)
        window.activity_label.setText("Generating…")
        window.update_controls()

    @Slot()
    def stop(self) -> None:
        """Stop the reply being written, or stop waiting for the model."""
        if self.pending is not None:
            self.pending = None
            self.window.show_thread()
            self.window.activity_label.setText("Not answered: the message is kept")
            self.window.update_controls()
        elif self.reply is not None and not self.reply.stopping:
            self.reply.stopping = True
            self.bridge.stop()
            self.window.activity_label.setText("Stopping…")
            self.window.update_controls()

    # --- engine events ---------------------------------------------------------------------------

    @Slot(object)
    def _on_reading(self, progress) -> None:
        """A long prompt being read (PrefillProgress): how far, in the reply's placeholder, and the
        prompt's size in the context meter, which otherwise waits for the first round's figures."""
        reply, window = self.reply, self.window
        if reply is None or window.conversation_id != reply.conversation_id:
            return
        window.chat_view.show_reading(f"Reading your message: {progress.summary()}")
        window.header.set_usage(progress.prompt_tokens)

    @Slot(object)
    def _on_piece(self, piece) -> None:
        reply, window = self.reply, self.window
        if reply is None:
            return
        spans = [(span.text, span.provenance) for span in piece.spans]
        reply.spans.extend(spans)
        reply.updater.append(piece.text)
        if reply.updater.error is not None and not window.storage_banner.isVisibleTo(window):
            window.storage_banner.show_error("save the reply as it arrives", reply.updater.error)
        if window.conversation_id == reply.conversation_id:
            window.chat_view.append_spans(spans)

    @Slot(object)
    def _on_round_stats(self, stats) -> None:
        if self.reply is not None:
            self.reply.last_stats = stats
            if self.window.conversation_id == self.reply.conversation_id:
                self.window.stats_panel.update_stats(stats)
                self.window.header.show_usage(stats)

    @Slot(object)
    def _on_finished(self, result) -> None:
        if self.reply is None:
            return
        status = "cancelled" if result.reason == "cancelled" else "complete"
        self._finish(status, result.stats, result, text=result.text or None)

    @Slot(str, str)
    def _on_failed(self, message: str, details: str) -> None:
        if self.reply is None:
            return
        self._finish("error", self.reply.last_stats, None, error=(message, details))

    def finish_on_close(self) -> None:
        """The window closes with the engine thread stopped: the reply's last signals (its end and its
        figures) wait in the queue; take them, so a stopped reply keeps its stats after a restart."""
        QtCore.QCoreApplication.sendPostedEvents(self, QtCore.QEvent.Type.MetaCall)
        if self.reply is not None:
            self._finish("cancelled", self.reply.last_stats, None)

    def _finish(self, status: str, stats, result, text: str | None = None, error=None) -> None:
        window = self.window
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
        ok, _ = window.write("save the reply", unsaved.save)
        if not ok:
            self.unsaved[reply.message_id] = unsaved
        if window.conversation_id == reply.conversation_id:
            window.chat_view.finish_streaming(final_text, status, record)
            if stats is not None:
                window.stats_panel.update_stats(stats, caption="The reply just written")
                window.chat_view.select_message(reply.message_id)
                window.header.show_usage(stats)
        if stats is not None and stats.source == "local":
            window.loading.show_models(stats)  # the drafter this reply used, for `auto`
        window.sidebar.refresh()
        window.activity_label.setText(
            {"complete": "Ready", "cancelled": "Stopped", "error": "Reply failed"}[status]
        )
        window.update_controls()
        if status == "complete" and ok:
            self._ask_for_title(reply, final_text)
        self.finished.emit(status)

    @Slot()
    def save_unsaved(self) -> bool:
        """Write the replies the store refused earlier; True when nothing is left unsaved."""
        for message_id, unsaved in list(self.unsaved.items()):
            ok, _ = self.window.write("save the reply", unsaved.save)
            if not ok:
                return False
            del self.unsaved[message_id]
        if not self.unsaved:
            self.window.storage_banner.hide()
        return True

    # --- titles ----------------------------------------------------------------------------------

    def _ask_for_title(self, reply: Reply, text: str) -> None:
        """After a conversation's first exchange, unless it was renamed: the model's title for it."""
        store = self.window.store
        if not self.window.config.auto_titles or not text.strip():
            return
        thread = store.thread(reply.conversation_id)
        if [m.role for m in thread] != ["user", "assistant"] or thread[-1].id != reply.message_id:
            return
        if store.get_conversation(reply.conversation_id).title != first_message_title(thread[0].content):
            return
        self.bridge.name_conversation(
            reply.conversation_id, [*reply.history, {"role": "assistant", "content": text}]
        )

    @Slot(int, str)
    def _on_titled(self, conversation_id: int, text: str) -> None:
        store, title = self.window.store, clean_title(text)
        conversation = store.get_conversation(conversation_id)
        first = store.thread(conversation_id)[0].content if store.thread(conversation_id) else ""
        if not title or conversation.title != first_message_title(first):
            return  # nothing usable, or the user renamed it meanwhile
        ok, _ = self.window.write(
            "name the conversation", lambda: store.rename_conversation(conversation_id, title)
        )
        if ok:
            self.window.sidebar.refresh()


def history_of(thread) -> list[dict]:
    """The messages a reply answers: the user's and the assistant's, without failed or empty ones."""
    return [
        {"role": m.role, "content": m.content}
        for m in thread
        if m.role in ("user", "assistant") and m.content and m.status != "error"
    ]
