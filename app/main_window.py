"""The main window: sidebar, chat, message box and stats; it owns the store and drives the engine bridge.

Every store write happens here, on the GUI thread: the user's message is committed before generation
starts, the reply is a 'streaming' row the ThrottledUpdater rewrites at least every half second, and the
final status and GenerationStats land on the same row when the worker reports back.
"""

from __future__ import annotations

import base64

from app.bridge import EngineBridge, EngineFactory, EngineInfo, LoadRequest, default_engine_factory
from app.chat_view import ChatView, ViewMessage, decode_provenance, encode_provenance
from app.config import AppConfig
from app.qt import Qt, QtCore, QtGui, QTimer, QtWidgets, Signal, Slot
from app.sidebar import Sidebar
from app.stats_panel import StatsPanel
from engine.store.streaming import ThrottledUpdater

WINDOW_KEY = "main_window"
UPDATE_INTERVAL_S = 0.5
TITLE_LENGTH = 48


class MessageEdit(QtWidgets.QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line."""

    submitted = Signal()

    def keyPressEvent(self, event):  # noqa: N802
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class Reply:
    """The reply being generated: where it goes in the store and what has arrived so far."""

    def __init__(self, store, conversation_id: int, message_id: int, meta: dict):
        self.conversation_id = conversation_id
        self.message_id = message_id
        self.meta = meta
        self.updater = ThrottledUpdater(store, message_id, interval=UPDATE_INTERVAL_S)
        self.spans: list[tuple[str, str]] = []
        self.last_stats = None
        self.stopping = False

    def provenance(self) -> dict:
        counts = {"draft": 0, "target": 0, "bonus": 0}
        for _, provenance in self.spans:
            counts[provenance] = counts.get(provenance, 0) + 1
        return {"provenance_counts": counts, "provenance_runs": encode_provenance(self.spans)}


class MainWindow(QtWidgets.QMainWindow):
    reply_finished = Signal(str)  # final status of a reply: complete, cancelled or error
    models_loaded = Signal(object)  # EngineInfo

    def __init__(self, store, config: AppConfig | None = None, engine_factory: EngineFactory = default_engine_factory):
        super().__init__()
        self.store = store
        self.config = config or AppConfig.load(store)
        self.bridge = EngineBridge(engine_factory, self)
        self.reply: Reply | None = None
        self.conversation_id: int | None = None
        self.editing_id: int | None = None
        self.progress_dialog: QtWidgets.QProgressDialog | None = None
        self.setWindowTitle("Tandem")
        self._build()
        self._connect_bridge()
        self._build_actions()
        self._restore_layout()
        self.sidebar.refresh()
        conversations = store.list_conversations()
        if conversations:
            self.sidebar.select(conversations[0].id)
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(int(UPDATE_INTERVAL_S * 1000))
        self._flush_timer.timeout.connect(self._flush_reply)
        self._update_controls()

    # --- layout ----------------------------------------------------------------------------------

    def _build(self) -> None:
        self.sidebar = Sidebar(self.store, self)
        self.chat_view = ChatView(self)
        self.stats_panel = StatsPanel(self)

        center = QtWidgets.QWidget(self)
        center_layout = QtWidgets.QVBoxLayout(center)
        center_layout.setContentsMargins(0, 0, 0, 0)
        center_layout.addWidget(self.chat_view, 1)
        self.edit_banner = QtWidgets.QLabel(center)
        self.edit_banner.setVisible(False)
        center_layout.addWidget(self.edit_banner)
        box = QtWidgets.QHBoxLayout()
        box.setContentsMargins(8, 4, 8, 8)
        self.message_edit = MessageEdit(center)
        self.message_edit.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line)")
        self.message_edit.setMaximumHeight(84)
        self.message_edit.submitted.connect(self.send)
        box.addWidget(self.message_edit, 1)
        self.send_button = QtWidgets.QPushButton("Send", center)
        self.send_button.clicked.connect(self._send_or_stop)
        box.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        center_layout.addLayout(box)

        self.splitter = QtWidgets.QSplitter(Qt.Orientation.Horizontal, self)
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(center)
        self.splitter.addWidget(self.stats_panel)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setStretchFactor(2, 0)
        self.splitter.setSizes([240, 640, 300])
        self.setCentralWidget(self.splitter)
        self.resize(1280, 800)

        self.models_label = QtWidgets.QLabel("No model loaded", self)
        self.activity_label = QtWidgets.QLabel("", self)
        self.statusBar().addWidget(self.models_label, 1)
        self.statusBar().addPermanentWidget(self.activity_label)

        self.sidebar.conversation_selected.connect(self.open_conversation)
        self.sidebar.message_selected.connect(self._open_search_hit)
        self.sidebar.new_requested.connect(self.new_conversation)
        self.sidebar.conversation_deleted.connect(self._on_conversation_deleted)
        self.chat_view.regenerate_requested.connect(self.regenerate)
        self.chat_view.edit_requested.connect(self.start_edit)
        self.chat_view.branch_requested.connect(self.switch_branch)
        self.chat_view.stats_requested.connect(self.stats_panel.show_saved)

    def _build_actions(self) -> None:
        def action(text: str, shortcut: str, slot) -> QtGui.QAction:
            act = QtGui.QAction(text, self)
            act.setShortcut(QtGui.QKeySequence(shortcut))
            act.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            act.triggered.connect(slot)
            self.addAction(act)
            return act

        self.new_action = action("New chat", "Ctrl+N", self.new_conversation)
        self.search_action = action("Search", "Ctrl+F", self.sidebar.focus_search)
        self.stop_action = action("Stop", "Esc", self.escape)
        self.settings_action = action("Settings…", "Ctrl+,", self.open_settings)
        menu = self.menuBar().addMenu("&Chat")
        for act in (self.new_action, self.search_action, self.stop_action, self.settings_action):
            menu.addAction(act)
        menu.addSeparator()
        quit_action = menu.addAction("Quit")
        quit_action.setShortcut(QtGui.QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.close)

    def _connect_bridge(self) -> None:
        worker = self.bridge.worker
        worker.progress.connect(self._on_progress)
        worker.loaded.connect(self._on_loaded)
        worker.load_failed.connect(self._on_load_failed)
        worker.load_cancelled.connect(self._on_load_cancelled)
        worker.piece.connect(self._on_piece)
        worker.round_stats.connect(self._on_round_stats)
        worker.finished.connect(self._on_finished)
        worker.failed.connect(self._on_failed)

    # --- window state, kept in the store --------------------------------------------------------

    def _restore_layout(self) -> None:
        saved = self.store.get_setting(WINDOW_KEY) or {}
        geometry = saved.get("geometry")
        if geometry:
            self.restoreGeometry(QtCore.QByteArray(base64.b64decode(geometry)))
        state = saved.get("splitter_state")
        if state:
            self.splitter.restoreState(QtCore.QByteArray(base64.b64decode(state)))
        if saved.get("colour_tokens"):
            self.chat_view.set_coloured(True)

    def save_layout(self) -> None:
        geometry = base64.b64encode(bytes(self.saveGeometry())).decode("ascii")
        self.store.set_setting(
            WINDOW_KEY,
            {
                "geometry": geometry,
                "splitter_state": base64.b64encode(bytes(self.splitter.saveState())).decode("ascii"),
                "splitter": self.splitter.sizes(),
                "colour_tokens": self.chat_view.coloured,
            },
        )

    def closeEvent(self, event):  # noqa: N802
        if self.reply is not None:
            self.bridge.stop()
        self.save_layout()
        if not self.bridge.shutdown():
            # A loading stage (converting a model, say) cannot be interrupted midway; it checks the
            # cancel flag between stages. Destroying a running QThread would abort the process.
            self.activity_label.setText("Waiting for the model loader to stop…")
            self.bridge.shutdown(timeout_ms=-1)
        if self.reply is not None:  # the worker has stopped; its last signals will not be delivered
            self._finish_reply("cancelled", None, None)
        self.sidebar.purge_deleted()
        super().closeEvent(event)

    # --- models ---------------------------------------------------------------------------------

    def load_models(self) -> None:
        self.activity_label.setText("Loading models…")
        self.progress_dialog = QtWidgets.QProgressDialog("Loading models…", "Cancel", 0, 0, self)
        self.progress_dialog.setWindowTitle("Tandem")
        self.progress_dialog.setMinimumDuration(400)
        self.progress_dialog.setAutoClose(False)
        self.progress_dialog.setAutoReset(False)
        self.progress_dialog.canceled.connect(self.bridge.cancel_load)
        self.bridge.load(LoadRequest.from_config(self.config))
        self._update_controls()

    def _close_progress(self) -> None:
        if self.progress_dialog is not None:
            self.progress_dialog.canceled.disconnect(self.bridge.cancel_load)
            self.progress_dialog.close()
            self.progress_dialog.deleteLater()
            self.progress_dialog = None

    @Slot(str, int, int)
    def _on_progress(self, stage: str, done: int, total: int) -> None:
        self.activity_label.setText(stage + "…")
        if self.progress_dialog is not None:
            self.progress_dialog.setLabelText(stage + "…")
            self.progress_dialog.setMaximum(max(total, 0))
            self.progress_dialog.setValue(min(done, total) if total > 0 else 0)

    @Slot(object)
    def _on_loaded(self, info: EngineInfo) -> None:
        self._close_progress()
        draft = info.draft or "none"
        if info.quantization != "none":
            draft += f" ({info.quantization})"
        self.models_label.setText(f"Target: {info.target}   Draft: {draft}   Device: {info.device}")
        self.models_label.setToolTip("\n".join(info.notices))
        self.activity_label.setText("Ready")
        self._update_controls()
        self.models_loaded.emit(info)

    @Slot(str, str)
    def _on_load_failed(self, message: str, details: str) -> None:
        self._close_progress()
        self.models_label.setText("No model loaded")
        self.activity_label.setText("Loading failed")
        self._update_controls()
        box = QtWidgets.QMessageBox(QtWidgets.QMessageBox.Icon.Warning, "Could not load the models", message, parent=self)
        box.setDetailedText(details)
        box.open()

    @Slot()
    def _on_load_cancelled(self) -> None:
        self._close_progress()
        self.activity_label.setText("Loading cancelled — open Settings (Ctrl+,) to load models")
        self._update_controls()

    @Slot()
    def open_settings(self) -> None:
        from app.settings_dialog import SettingsDialog

        dialog = SettingsDialog(self.config, self.store, self)
        dialog.applied.connect(self.apply_config)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()

    @Slot(object)
    def apply_config(self, config: AppConfig) -> None:
        """Settings take effect at once: a reload only when the models themselves changed."""
        old, self.config = self.config, config
        config.save(self.store)
        if old.models_changed(config) or self.bridge.info is None:
            self.load_models()
        else:
            self.bridge.apply_settings(config.speculation(), config.sampling())

    # --- conversations --------------------------------------------------------------------------

    @Slot()
    def new_conversation(self) -> None:
        self.conversation_id = None
        self.cancel_edit()
        self.sidebar.list.clearSelection()
        self.sidebar.list.setCurrentItem(None)
        self.chat_view.clear()
        self.stats_panel.reset()
        self.message_edit.setFocus()

    @Slot(int)
    def open_conversation(self, conversation_id: int) -> None:
        self.conversation_id = conversation_id
        self.cancel_edit()
        self._show_thread()
        last = next((w.message for w in reversed(self.chat_view.widgets) if w.message.stats), None)
        if self.reply is None or self.reply.conversation_id != conversation_id:
            self.stats_panel.show_saved(last.stats if last else None)

    @Slot(int, int)
    def _open_search_hit(self, conversation_id: int, message_id: int) -> None:
        thread_ids = {m.id for m in self.store.thread(conversation_id)}
        if message_id not in thread_ids:
            self.store.switch_branch(message_id)
        self.open_conversation(conversation_id)
        widget = self.chat_view.widget_for(message_id)
        if widget is not None:
            self.chat_view.follow = False
            self.chat_view.scroll.ensureWidgetVisible(widget)

    @Slot(int)
    def _on_conversation_deleted(self, conversation_id: int) -> None:
        if self.reply is not None and self.reply.conversation_id == conversation_id:
            self.stop()
        if self.conversation_id == conversation_id:
            self.conversation_id = None
            self.chat_view.clear()

    def _show_thread(self) -> None:
        if self.conversation_id is None:
            self.chat_view.clear()
            return
        messages = []
        for message in self.store.thread(self.conversation_id):
            view = ViewMessage(message.id, message.role, message.content, message.status, message.stats)
            if self.reply is not None and message.id == self.reply.message_id:
                view.text, view.spans, view.status = self.reply.updater.text, list(self.reply.spans), "streaming"
            elif message.stats and message.stats.get("provenance_runs"):
                view.spans = decode_provenance(message.content, message.stats["provenance_runs"])
            siblings = self.store.siblings(message.id)
            if len(siblings) > 1:
                view.branch = ([s.id for s in siblings].index(message.id) + 1, len(siblings))
            messages.append(view)
        self.chat_view.set_messages(messages)

    # --- sending --------------------------------------------------------------------------------

    @Slot()
    def _send_or_stop(self) -> None:
        if self.reply is not None:
            self.stop()
        else:
            self.send()

    @Slot()
    def send(self) -> None:
        text = self.message_edit.toPlainText().strip()
        if not text or self.reply is not None:
            return
        if self.bridge.info is None:
            self.activity_label.setText("Load a model first: open Settings (Ctrl+,)")
            return
        if self.conversation_id is None:
            title = " ".join(text.split())[:TITLE_LENGTH]
            self.conversation_id = self.store.create_conversation(
                title=title, target_model=self.config.target, system_prompt=self.config.system_prompt
            )
        if self.editing_id is not None:
            self.store.edit_message(self.editing_id, text)
            self.cancel_edit()
        else:
            self.store.add_message(self.conversation_id, "user", text)
        self.message_edit.clear()
        self._start_reply()

    def _start_reply(self, parent_id: int | None = None) -> None:
        conversation_id = self.conversation_id
        thread = self.store.thread(conversation_id)
        if parent_id is not None:  # regenerating: the history ends at the message being answered
            ids = [m.id for m in thread]
            thread = thread[: ids.index(parent_id) + 1]
        conversation = self.store.get_conversation(conversation_id)
        history = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
        history += [
            {"role": m.role, "content": m.content}
            for m in thread
            if m.role in ("user", "assistant") and m.content and m.status != "error"
        ]
        info = self.bridge.info
        meta = {"target": info.target, "draft": info.draft, "quantization": info.quantization, "device": info.device}
        parent = parent_id if parent_id is not None else thread[-1].id
        message_id = self.store.begin_assistant(conversation_id, parent_id=parent, meta=meta)
        self.reply = Reply(self.store, conversation_id, message_id, meta)
        self._show_thread()
        self.sidebar.refresh(select_id=conversation_id)
        self.stats_panel.reset()
        self._flush_timer.start()
        self.bridge.respond(history)
        self.activity_label.setText("Generating…")
        self._update_controls()

    @Slot(int)
    def regenerate(self, message_id: int) -> None:
        if self.reply is not None or self.bridge.info is None:
            return
        message = self.store.get_message(message_id)
        if message.parent_id is None:
            return
        self._start_reply(parent_id=message.parent_id)

    @Slot(int)
    def start_edit(self, message_id: int) -> None:
        if self.reply is not None:
            return
        self.editing_id = message_id
        self.message_edit.setPlainText(self.store.get_message(message_id).content)
        self.edit_banner.setText("  Editing a message: Enter sends it as a new version, Esc cancels.")
        self.edit_banner.setVisible(True)
        self.message_edit.setFocus()

    def cancel_edit(self) -> None:
        if self.editing_id is not None:
            self.editing_id = None
            self.message_edit.clear()
        self.edit_banner.setVisible(False)

    @Slot(int, int)
    def switch_branch(self, message_id: int, step: int) -> None:
        if self.reply is not None:
            return
        siblings = [s.id for s in self.store.siblings(message_id)]
        index = siblings.index(message_id) + step
        if 0 <= index < len(siblings):
            self.store.switch_branch(siblings[index])
            self._show_thread()

    @Slot()
    def escape(self) -> None:
        if self.reply is not None:
            self.stop()
        elif self.editing_id is not None:
            self.cancel_edit()

    @Slot()
    def stop(self) -> None:
        if self.reply is not None and not self.reply.stopping:
            self.reply.stopping = True
            self.bridge.stop()
            self.activity_label.setText("Stopping…")
            self._update_controls()

    # --- engine events --------------------------------------------------------------------------

    @Slot(object)
    def _on_piece(self, piece) -> None:
        reply = self.reply
        if reply is None:
            return
        spans = [(span.text, span.provenance) for span in piece.spans]
        reply.spans.extend(spans)
        reply.updater.append(piece.text)
        if self.conversation_id == reply.conversation_id:
            self.chat_view.append_spans(spans)

    @Slot(object)
    def _on_round_stats(self, stats) -> None:
        if self.reply is not None:
            self.reply.last_stats = stats
            if self.conversation_id == self.reply.conversation_id:
                self.stats_panel.update_stats(stats)

    @Slot()
    def _flush_reply(self) -> None:
        reply = self.reply
        if reply is not None and reply.updater.committed_chars != len(reply.updater.text):
            reply.updater.flush()

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
        self._flush_timer.stop()
        record = {**reply.meta, **(stats.to_dict() if stats is not None else {}), **reply.provenance()}
        if result is not None:
            record["finish_reason"] = result.reason
        if error is not None:
            record["error"], record["error_details"] = error
        final_text = text or reply.updater.text
        token_count = len(result.token_ids) if result is not None else len(reply.spans)
        self.store.finish_message(reply.message_id, status, text=final_text, stats=record, token_count=token_count)
        if self.conversation_id == reply.conversation_id:
            self.chat_view.finish_streaming(final_text, status, record)
            if stats is not None:
                self.stats_panel.update_stats(stats)
        self.sidebar.refresh()
        self.activity_label.setText({"complete": "Ready", "cancelled": "Stopped", "error": "Reply failed"}[status])
        self._update_controls()
        self.reply_finished.emit(status)

    def _update_controls(self) -> None:
        generating = self.reply is not None
        self.send_button.setText("Stop" if generating else "Send")
        self.send_button.setToolTip("Stop generating (Esc)" if generating else "Send (Enter)")
        self.send_button.setEnabled(not (generating and self.reply.stopping))
