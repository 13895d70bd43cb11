"""The main window: sidebar, chat, message box and stats; it owns the store and drives the engine bridge.

Store writes happen on the GUI thread, here and in the widgets the window holds: the sidebar renames,
deletes and restores conversations, app/conversation_actions.py sets system prompts and imports. The
user's message is committed before generation starts; the reply is a 'streaming' row that its
ThrottledUpdater (app/reply.py) rewrites on its own thread at least every half second; the final
status and GenerationStats land on the same row when the worker reports back.

A write that fails after start-up (engine.errors.StorageError: disk full, read-only, locked) is shown
in a banner (app/storage_guard.py) and never loses what is on screen: the reply keeps streaming, a
finished reply that could not be saved is kept in memory and written at the next chance.

Menus live in app/window_menus.py, export/import/system prompt in app/conversation_actions.py; loading
models and settings in app/window_loading.py, the engine's reply events in app/window_replies.py.
"""

from __future__ import annotations

import base64

from app.appearance import apply_appearance
from app.bridge import EngineBridge, EngineFactory, default_engine_factory
from app.chat_view import ChatView, ViewMessage, decode_provenance
from app.config import AppConfig
from app.conversation_actions import ConversationActions, dropped_exports
from app.message_edit import MessageEdit
from app.qt import Qt, QtCore, QtWidgets, Signal, Slot
from app.reply import UPDATE_INTERVAL_S, Reply, UnsavedReply
from app.sidebar import Sidebar
from app.stats_panel import StatsPanel
from app.storage_guard import StorageBanner, guarded
from app.window_loading import ModelLoading, optimize_label
from app.window_menus import build_menus, shortcut_actions
from app.window_replies import ReplyEvents

WINDOW_KEY = "main_window"
TITLE_LENGTH = 48
__all__ = ["MainWindow", "UPDATE_INTERVAL_S", "WINDOW_KEY"]


class MainWindow(ModelLoading, ReplyEvents, QtWidgets.QMainWindow):
    reply_finished = Signal(str)  # final status of a reply: complete, cancelled or error
    models_loaded = Signal(object)  # EngineInfo

    def __init__(
        self, store, config: AppConfig | None = None, engine_factory: EngineFactory = default_engine_factory
    ):
        super().__init__()
        self.store = store
        self.config = config or AppConfig.load(store)
        self.bridge = EngineBridge(engine_factory, self)
        self.reply: Reply | None = None
        self.close_question: QtWidgets.QMessageBox | None = None
        self.unsaved: dict[int, UnsavedReply] = {}  # finished replies the store refused, by message id
        self.conversation_id: int | None = None
        self.editing_id: int | None = None
        self.progress_dialog: QtWidgets.QProgressDialog | None = None
        self.appearance = "system"
        self.conversation_actions = ConversationActions(self)
        self.setWindowTitle("Tandem")
        self.setAcceptDrops(True)
        self._build()
        self._connect_bridge()
        build_menus(self)
        self._restore_layout()
        self.sidebar.refresh()
        conversations = store.list_conversations()
        if conversations:
            self.sidebar.select(conversations[0].id)
        self._update_controls()
        self.message_edit.setFocus(Qt.FocusReason.OtherFocusReason)

    # --- layout ----------------------------------------------------------------------------------

    def _build(self) -> None:
        self.sidebar = Sidebar(self.store, self)
        self.chat_view = ChatView(self)
        self.stats_panel = StatsPanel(self)

        center = QtWidgets.QWidget(self)
        center_layout = QtWidgets.QVBoxLayout(center)
        center_layout.setContentsMargins(0, 0, 0, 0)
        self.storage_banner = StorageBanner(center)
        self.storage_banner.retry_requested.connect(self.save_unsaved)
        center_layout.addWidget(self.storage_banner)
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
        for index, widget in enumerate((self.sidebar, center, self.stats_panel)):
            self.splitter.addWidget(widget)
            self.splitter.setStretchFactor(index, 1 if widget is center else 0)
        self.splitter.setCollapsible(1, False)
        self.splitter.setSizes([240, 640, self.stats_panel.width()])
        self.setCentralWidget(self.splitter)
        self.resize(1280, 800)

        self.models_label = QtWidgets.QLabel("No model loaded", self)
        self.activity_label = QtWidgets.QLabel("", self)
        self.optimize_label = optimize_label(self)  # the engine's background optimization
        self.statusBar().addWidget(self.models_label, 1)
        self.statusBar().addPermanentWidget(self.optimize_label)
        self.statusBar().addPermanentWidget(self.activity_label)

        self.sidebar.conversation_selected.connect(self.open_conversation)
        self.sidebar.message_selected.connect(self.open_search_hit)
        self.sidebar.new_requested.connect(self.new_conversation)
        self.sidebar.conversation_deleted.connect(self._on_conversation_deleted)
        self.sidebar.menu_requested.connect(self.conversation_actions.show_conversation_menu)
        self.sidebar.storage_failed.connect(self.storage_banner.show_error)
        self.chat_view.regenerate_requested.connect(self.regenerate)
        self.chat_view.edit_requested.connect(self.start_edit)
        self.chat_view.branch_requested.connect(self.switch_branch)
        self.chat_view.stats_requested.connect(self.show_message_stats)
        self.chat_view.copied.connect(lambda: self.statusBar().showMessage("Copied to the clipboard.", 2500))

    def _connect_bridge(self) -> None:
        worker = self.bridge.worker
        worker.progress.connect(self._on_progress)
        worker.loaded.connect(self._on_loaded)
        self.connect_optimizing(worker)
        worker.load_failed.connect(self._on_load_failed)
        worker.load_cancelled.connect(self._on_load_cancelled)
        worker.piece.connect(self._on_piece)
        worker.round_stats.connect(self._on_round_stats)
        worker.finished.connect(self._on_finished)
        worker.failed.connect(self._on_failed)

    def write(self, what: str, action):
        """One store write from the GUI; a StorageError goes to the banner. Returns (ok, result)."""
        return guarded(self.storage_banner, what, action)

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
        self.set_appearance(saved.get("appearance", "system"), save=False)

    def save_layout(self) -> None:
        geometry = base64.b64encode(bytes(self.saveGeometry())).decode("ascii")
        layout = {
            "geometry": geometry,
            "splitter_state": base64.b64encode(bytes(self.splitter.saveState())).decode("ascii"),
            "splitter": self.splitter.sizes(),
            "colour_tokens": self.chat_view.coloured,
            "appearance": self.appearance,
        }
        self.write("save the window layout", lambda: self.store.set_setting(WINDOW_KEY, layout))

    def set_appearance(self, mode: str, save: bool = True) -> None:
        """Light, dark, or following the system; remembered with the window layout."""
        self.appearance = apply_appearance(mode)
        self.appearance_actions[self.appearance].setChecked(True)
        if save:
            self.save_layout()

    def request_close(self) -> None:
        """Quit, or the window's close button: while a reply is being written, ask first."""
        if self.reply is None:
            self.close()
            return
        box = QtWidgets.QMessageBox(
            QtWidgets.QMessageBox.Icon.Question,
            "Quit while writing?",
            "A reply is still being written. Quit and stop it? The text written so far is kept.",
            parent=self,
        )
        box.setObjectName("confirm_close")
        quit_button = box.addButton("Stop and quit", QtWidgets.QMessageBox.ButtonRole.AcceptRole)
        box.addButton("Keep writing", QtWidgets.QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(quit_button)
        box.buttonClicked.connect(lambda button: button is quit_button and self.close())
        box.open()
        self.close_question = box

    def closeEvent(self, event):  # noqa: N802
        if event.spontaneous() and self.reply is not None:  # the window manager's close button
            event.ignore()
            self.request_close()
            return
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
        self.save_unsaved()
        self.write("delete conversations for good", self.sidebar.purge_deleted)
        super().closeEvent(event)

    def dragEnterEvent(self, event):  # noqa: N802
        if dropped_exports(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event):  # noqa: N802
        paths = dropped_exports(event.mimeData())
        if paths:
            event.acceptProposedAction()
            self.conversation_actions.import_files(paths)

    @Slot()
    def show_help(self) -> None:
        from app.help_dialog import HelpDialog

        dialog = HelpDialog(shortcut_actions(self), self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()

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
        if self.reply is None or self.reply.conversation_id != conversation_id:
            last = next((w.message for w in reversed(self.chat_view.widgets) if w.message.stats), None)
            if last is not None and "generated_tokens" in last.stats:
                self.show_message_stats(last, caption="The last reply")
            else:
                self.stats_panel.reset()

    @Slot(object)
    def show_message_stats(self, message: ViewMessage, caption: str = "The reply you clicked") -> None:
        """Bring a stored reply's numbers and charts back into the stats panel."""
        self.stats_panel.show_saved(message.stats, caption=caption)
        self.chat_view.select_message(message.id)

    @Slot(int, int)
    def open_search_hit(self, conversation_id: int, message_id: int) -> None:
        """Open the conversation on the branch that holds the message, scrolled to it."""
        thread_ids = {m.id for m in self.store.thread(conversation_id)}
        if message_id not in thread_ids and self.reply is None:
            self.write("switch to that version", lambda: self.store.switch_branch(message_id))
        self.open_conversation(conversation_id)
        self.chat_view.select_message(message_id)
        self.chat_view.scroll_to_message(message_id)

    @Slot(int)
    def _on_conversation_deleted(self, conversation_id: int) -> None:
        if self.reply is not None and self.reply.conversation_id == conversation_id:
            self.stop()
        if self.conversation_id == conversation_id:
            self.conversation_id = None
            self.chat_view.clear()
            self.stats_panel.reset()

    def _show_thread(self) -> None:
        if self.conversation_id is None:
            self.chat_view.clear()
            return
        messages = []
        for message in self.store.thread(self.conversation_id):
            view = ViewMessage(message.id, message.role, message.content, message.status, message.stats)
            unsaved = self.unsaved.get(message.id)
            if self.reply is not None and message.id == self.reply.message_id:
                view.text, view.spans, view.status = (
                    self.reply.updater.text,
                    list(self.reply.spans),
                    "streaming",
                )
            elif unsaved is not None:
                view.text, view.status, view.stats = unsaved.text, unsaved.status, unsaved.record
            if view.spans is None and view.stats and view.stats.get("provenance_runs"):
                view.spans = decode_provenance(view.text, view.stats["provenance_runs"])
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
        if not self.save_unsaved():
            return  # the message stays in the box; the banner says why
        ok, _ = self.write("save your message", lambda: self._store_user_message(text))
        if not ok:
            return
        self.message_edit.clear()
        self._start_reply()

    def _store_user_message(self, text: str) -> None:
        if self.conversation_id is None:
            title = conversation_title(text)
            prompt = self.conversation_actions.system_prompt_for_new()
            self.conversation_id = self.store.create_conversation(
                title=title, target_model=self.config.target, system_prompt=prompt
            )
        if self.editing_id is not None:
            self.store.edit_message(self.editing_id, text)
            self.cancel_edit()
        else:
            self.store.add_message(self.conversation_id, "user", text)

    def _start_reply(self, parent_id: int | None = None) -> None:
        conversation_id = self.conversation_id
        thread = self.store.thread(conversation_id)
        if parent_id is not None:  # regenerating: the history ends at the message being answered
            ids = [m.id for m in thread]
            thread = thread[: ids.index(parent_id) + 1]
        conversation = self.store.get_conversation(conversation_id)
        prompt = conversation.system_prompt or self.config.system_prompt
        history = [{"role": "system", "content": prompt}] if prompt else []
        history += [
            {"role": m.role, "content": m.content}
            for m in thread
            if m.role in ("user", "assistant") and m.content and m.status != "error"
        ]
        info = self.bridge.info
        meta = {
            "target": info.target,
            "draft": info.draft,
            "quantization": info.quantization,
            "device": info.device,
        }
        parent = parent_id if parent_id is not None else thread[-1].id
        ok, message_id = self.write(
            "start the reply",
            lambda: self.store.begin_assistant(conversation_id, parent_id=parent, meta=meta),
        )
        if not ok:
            self._show_thread()
            return
        self.reply = Reply(self.store, conversation_id, message_id, meta)
        self._show_thread()
        self.sidebar.refresh(select_id=conversation_id)
        self.stats_panel.reset()
        self.bridge.respond(history)
        self.activity_label.setText("Generating…")
        self._update_controls()

    @Slot(int)
    def regenerate(self, message_id: int) -> None:
        if self.reply is not None or self.bridge.info is None:
            return
        message = self.store.get_message(message_id)
        if message.parent_id is None or not self.save_unsaved():
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
            ok, _ = self.write("switch to that version", lambda: self.store.switch_branch(siblings[index]))
            if ok:
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

    def _update_controls(self) -> None:
        generating = self.reply is not None
        self.send_button.setText("Stop" if generating else "Send")
        self.send_button.setToolTip("Stop generating (Esc)" if generating else "Send (Enter)")
        self.send_button.setEnabled(not (generating and self.reply.stopping))


def conversation_title(text: str) -> str:
    """A new conversation's title: its first message on one line, cut at a word with an ellipsis."""
    line = " ".join(text.split())
    if len(line) <= TITLE_LENGTH:
        return line
    cut = line[: TITLE_LENGTH - 1]
    if " " in cut[TITLE_LENGTH // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,.;:") + "…"
