"""The main window: sidebar, chat with its header, message box, and the side panel (stats, sampling).

It lays the window out, keeps the store and the conversation in view, and holds two controllers that
own their jobs: `loading` (app/window_loading.py: which models answer, loads, settings) and `replies`
(app/window_replies.py: the reply being written, one waiting for the model, the replies the store
refused). Menus live in app/window_menus.py; export, import and system prompts in
app/conversation_actions.py; the bar above the chat in app/chat_header.py.

Store writes happen on the GUI thread. The user's message is committed before generation starts; the
reply is a 'streaming' row that its ThrottledUpdater (app/reply.py) rewrites on its own thread at
least every half second. A write that fails after start-up (engine.errors.StorageError) is shown in a
banner (app/storage_guard.py) and never loses what is on screen.
"""

from __future__ import annotations

import base64

from app.appearance import apply_appearance
from app.bridge import EngineBridge, EngineFactory, default_engine_factory
from app.chat_header import usage_of
from app.chat_view import ViewMessage, decode_provenance
from app.config import AppConfig
from app.conversation_actions import ConversationActions, dropped_exports
from app.message_edit import MessageEditor
from app.qt import Qt, QtCore, QtWidgets, Signal, Slot
from app.reply import UPDATE_INTERVAL_S
from app.stats_format import stats_from_dict
from app.storage_guard import guarded
from app.titles import first_message_title as conversation_title
from app.window_layout import build_layout
from app.window_loading import LoadingController
from app.window_menus import build_menus, shortcut_actions
from app.window_replies import WAITING_ID, ReplyController

WINDOW_KEY = "main_window"
__all__ = ["MainWindow", "UPDATE_INTERVAL_S", "WINDOW_KEY", "conversation_title"]


class MainWindow(QtWidgets.QMainWindow):
    reply_finished = Signal(str)  # final status of a reply: complete, cancelled or error
    models_loaded = Signal(object)  # EngineInfo: a new engine answers from now on

    def __init__(
        self, store, config: AppConfig | None = None, engine_factory: EngineFactory = default_engine_factory
    ):
        super().__init__()
        self.store = store
        self.config = config or AppConfig.load(store)
        self.bridge = EngineBridge(engine_factory, self)
        self.close_question: QtWidgets.QMessageBox | None = None
        self.conversation_id: int | None = None
        self.appearance = "system"
        self.conversation_actions = ConversationActions(self)
        self.setWindowTitle("Tandem")
        self.setAcceptDrops(True)
        build_layout(self)
        self.editor = MessageEditor(self)
        self.loading = LoadingController(self)
        self.replies = ReplyController(self)
        self.statusBar().addPermanentWidget(self.loading.progress)
        self.loading.loaded.connect(self._on_engine_loaded)
        self.loading.unavailable.connect(self.replies.engine_unavailable)
        self.loading.config_applied.connect(self._on_config_applied)
        self.replies.finished.connect(self.reply_finished)
        build_menus(self)
        self._restore_layout()
        self.header.set_model(self.config.target, loading=True)
        self.bridge.probes.answered.connect(self._on_probe)
        self.bridge.probes.submit("window:models", _known_models)
        self.sidebar.refresh()
        self.refresh_header()
        conversations = store.list_conversations()
        if conversations:
            self.sidebar.select(conversations[0].id)
        self.update_controls()
        self.message_edit.setFocus(Qt.FocusReason.OtherFocusReason)

    @property
    def reply(self):
        """The reply being written, or None."""
        return self.replies.reply

    @property
    def unsaved(self):
        return self.replies.unsaved

    # --- layout ----------------------------------------------------------------------------------

    def write(self, what: str, action):
        """One store write from the GUI; a StorageError goes to the banner. Returns (ok, result)."""
        return guarded(self.storage_banner, what, action)

    # --- the controllers' doors, for menus, dialogs and tests ------------------------------------

    def load_models(self) -> None:
        self.loading.load()

    @Slot(object)
    def apply_config(self, config: AppConfig) -> None:
        self.loading.apply_config(config)

    @Slot()
    def open_settings(self) -> None:
        self.loading.open_settings()

    @Slot()
    def save_unsaved(self) -> bool:
        return self.replies.save_unsaved()

    @Slot()
    def stop(self) -> None:
        self.replies.stop()

    @Slot(object)
    def _on_engine_loaded(self, info) -> None:
        self.header.set_model(self.config.target, loading=self.loading.busy)
        self.header.set_context_limit(info.context_length)
        self.replies.engine_ready(info)
        self.models_loaded.emit(info)

    @Slot(object)
    def _on_config_applied(self, config: AppConfig) -> None:
        self.sampling_panel.show_config(config)
        self.header.set_model(config.target, loading=self.loading.busy)
        self.refresh_header()

    @Slot(str, int, object, object)
    def _on_probe(self, kind: str, _token: int, result, error) -> None:
        if kind == "window:models" and error is None:
            self.header.add_models(result)

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
        self.set_side_panel_visible(saved.get("side_panel", True), save=False)
        self.set_appearance(saved.get("appearance", "system"), save=False)

    def save_layout(self) -> None:
        geometry = base64.b64encode(bytes(self.saveGeometry())).decode("ascii")
        layout = {
            "geometry": geometry,
            "splitter_state": base64.b64encode(bytes(self.splitter.saveState())).decode("ascii"),
            "splitter": self.splitter.sizes(),
            "colour_tokens": self.chat_view.coloured,
            "appearance": self.appearance,
            "side_panel": not self.side_panel.isHidden(),
        }
        self.write("save the window layout", lambda: self.store.set_setting(WINDOW_KEY, layout))

    def set_appearance(self, mode: str, save: bool = True) -> None:
        """Light, dark, or following the system; remembered with the window layout."""
        self.appearance = apply_appearance(mode)
        self.appearance_actions[self.appearance].setChecked(True)
        if save:
            self.save_layout()

    @Slot(bool)
    def set_side_panel_visible(self, visible: bool, save: bool = True) -> None:
        """Show or collapse the side panel (stats and sampling); the chat takes its width."""
        self.side_panel.setVisible(visible)
        for control in (self.header.side_button, getattr(self, "side_panel_action", None)):
            if control is not None and control.isChecked() != visible:
                control.setChecked(visible)
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
        self.replies.finish_on_close()
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
        self.editor.cancel()
        self.sidebar.list.clearSelection()
        self.sidebar.list.setCurrentItem(None)
        self.chat_view.clear()
        self.stats_panel.reset()
        self.refresh_header()
        self.message_edit.setFocus()

    @Slot(int)
    def open_conversation(self, conversation_id: int) -> None:
        self.conversation_id = conversation_id
        self.editor.cancel()
        self.show_thread()
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

    def show_reply_for(self, message_id: int, caption: str = "The reply in view") -> None:
        """The panel shows the reply a jump landed on: that message's figures, or those of the reply to it."""
        widgets = self.chat_view.widgets
        index = next((i for i, w in enumerate(widgets) if w.message.id == message_id), None)
        if index is None or (self.reply is not None and self.reply.conversation_id == self.conversation_id):
            return
        after = [w.message for w in widgets[index:] if w.message.role == "assistant"][:1]
        if after and "generated_tokens" in (after[0].stats or {}):
            self.show_message_stats(after[0], caption=caption)

    @Slot(int, int)
    def open_search_hit(self, conversation_id: int, message_id: int) -> None:
        """Open the conversation on the branch that holds the message, scrolled to it."""
        thread_ids = {m.id for m in self.store.thread(conversation_id)}
        if message_id not in thread_ids and self.reply is None:
            self.write("switch to that version", lambda: self.store.switch_branch(message_id))
        self.open_conversation(conversation_id)
        self.show_reply_for(message_id, caption="The reply you searched for")
        self.chat_view.select_message(message_id)
        self.chat_view.scroll_to_message(message_id)

    @Slot(int)
    def on_conversation_deleted(self, conversation_id: int) -> None:
        if self.reply is not None and self.reply.conversation_id == conversation_id:
            self.stop()
        if self.conversation_id == conversation_id:
            self.conversation_id = None
            self.chat_view.clear()
            self.stats_panel.reset()
            self.refresh_header()

    def show_thread(self) -> None:
        """The visible thread of the open conversation, with the reply being written or waiting."""
        if self.conversation_id is None:
            self.chat_view.clear()
            self.refresh_header()
            return
        reply, pending = self.reply, self.replies.pending
        messages = []
        for message in self.store.thread(self.conversation_id):
            view = ViewMessage(message.id, message.role, message.content, message.status, message.stats)
            unsaved = self.unsaved.get(message.id)
            if reply is not None and message.id == reply.message_id:
                view.text, view.spans, view.status = reply.updater.text, list(reply.spans), "streaming"
            elif unsaved is not None:
                view.text, view.status, view.stats = unsaved.text, unsaved.status, unsaved.record
            if view.spans is None and view.stats and view.stats.get("provenance_runs"):
                view.spans = decode_provenance(view.text, view.stats["provenance_runs"])
            siblings = self.store.siblings(message.id)
            if len(siblings) > 1:
                view.branch = ([s.id for s in siblings].index(message.id) + 1, len(siblings))
            messages.append(view)
        waiting = pending is not None and pending.conversation_id == self.conversation_id
        if waiting:
            messages.append(ViewMessage(WAITING_ID, "assistant", "", status="waiting"))
        elif messages and messages[-1].role == "user" and reply is None:
            messages[-1].extra["unanswered"] = True  # its reply never came: it can be answered now
        self.chat_view.set_messages(messages)
        self.refresh_header()

    def refresh_header(self) -> None:
        """The system prompt mark and the context used, for the open conversation."""
        if self.conversation_id is None:
            own = self.conversation_actions.pending_system_prompt
            self.header.set_own_prompt(own if own and own != self.config.system_prompt else None)
            self.header.set_usage(0)
            return
        prompt = self.store.get_conversation(self.conversation_id).system_prompt
        self.header.set_own_prompt(prompt if prompt and prompt != self.config.system_prompt else None)
        replies = [w.message for w in self.chat_view.widgets if "generated_tokens" in (w.message.stats or {})]
        self.header.set_usage(usage_of(stats_from_dict(replies[-1].stats)) if replies else None)

    # --- sending --------------------------------------------------------------------------------

    @Slot()
    def send_or_stop(self) -> None:
        if self.replies.busy:
            self.stop()
        else:
            self.send()

    @Slot()
    def send(self) -> None:
        text = self.message_edit.toPlainText().strip()
        if not text or self.replies.busy:
            return
        if self.bridge.info is None and not self.loading.busy:
            self.activity_label.setText("Load a model first: open Settings (Ctrl+,)")
            return
        if not self.save_unsaved():
            return  # the message stays in the box; the banner says why
        ok, _ = self.write("save your message", lambda: self._store_user_message(text))
        if not ok:
            return
        self.message_edit.clear()
        self.replies.start(self.conversation_id)

    def _store_user_message(self, text: str) -> None:
        if self.conversation_id is None:
            prompt = self.conversation_actions.system_prompt_for_new()
            self.conversation_id = self.store.create_conversation(
                title=conversation_title(text), target_model=self.config.target, system_prompt=prompt
            )
        if self.editor.editing_id is not None:
            self.store.edit_message(self.editor.editing_id, text)
            self.editor.cancel()
        else:
            self.store.add_message(self.conversation_id, "user", text)

    @Slot(int)
    def regenerate(self, message_id: int) -> None:
        message = self.store.get_message(message_id)
        if self.replies.busy or message.parent_id is None or not self.save_unsaved():
            return
        self.replies.start(message.conversation_id, parent_id=message.parent_id)

    @Slot(int)
    def answer(self, message_id: int) -> None:
        """Answer a question whose reply never came (the model was not ready, or the app closed)."""
        if not self.replies.busy and self.save_unsaved():
            self.replies.start(self.store.get_message(message_id).conversation_id, parent_id=message_id)

    @Slot(int, int)
    def switch_branch(self, message_id: int, step: int) -> None:
        if self.reply is not None:
            return
        siblings = [s.id for s in self.store.siblings(message_id)]
        index = siblings.index(message_id) + step
        if 0 <= index < len(siblings):
            ok, _ = self.write("switch to that version", lambda: self.store.switch_branch(siblings[index]))
            if ok:
                self.show_thread()
                self.show_reply_for(siblings[index], caption="The version in view")

    @Slot()
    def escape(self) -> None:
        if self.replies.busy:
            self.stop()
        elif self.editor.editing_id is not None:
            self.editor.cancel()

    def update_controls(self) -> None:
        reply, waiting = self.reply, self.replies.pending is not None
        self.send_button.setText("Stop" if reply is not None else "Cancel" if waiting else "Send")
        tips = {
            "Stop": "Stop generating (Esc)",
            "Cancel": "Stop waiting for the model (Esc)",
            "Send": "Send (Enter)",
        }
        self.send_button.setToolTip(tips[self.send_button.text()])
        self.send_button.setEnabled(not (reply is not None and reply.stopping))
        if waiting:
            self.activity_label.setText("Your message waits for the model to load")


def _known_models() -> list[str]:
    """On the probe thread: the models the switcher offers (built-in, catalogue, on disk)."""
    from engine.models import probes

    return probes.known_specs()
