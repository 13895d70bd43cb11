"""The main window's reachable features, driven the way a user drives them: system prompt, export and
import (menu, context menu, drag and drop), search that lands on the message, stats of an old reply,
copy confirmation, help, appearance, focus, and storage failures after start-up."""

from __future__ import annotations

import json
import sqlite3
import threading

import pytest
from test_app import ScriptedEngine, factory_for, open_window, send, start_long_reply

from app.conversation_actions import ConversationActions
from app.help_dialog import HelpDialog
from app.qt import QtCore, QtGui, QtWidgets
from app.settings_dialog import SystemPromptDialog
from engine.store.database import Store
from engine.store.export import export_json

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "tandem.db", busy_timeout_s=0.2)
    yield store
    store.close()


@pytest.fixture(autouse=True)
def _restore_palette_and_close_boxes(qtbot):
    palette = QtGui.QPalette(QtWidgets.QApplication.palette())
    yield
    QtWidgets.QApplication.setPalette(palette)
    for widget in QtWidgets.QApplication.topLevelWidgets():
        if isinstance(widget, (QtWidgets.QMessageBox, QtWidgets.QDialog)) and widget.isVisible():
            widget.close()


def menu_action(window, menu_title: str, text: str) -> QtGui.QAction:
    menu = next(a.menu() for a in window.menuBar().actions() if a.text().replace("&", "") == menu_title)
    return next(a for a in menu.actions() if a.text() == text)


def open_dialog(window, kind):
    dialogs = [d for d in window.findChildren(kind) if d.isVisible()]
    assert len(dialogs) == 1, dialogs
    return dialogs[0]


def drop(window, paths) -> None:
    mime = QtCore.QMimeData()
    mime.setUrls([QtCore.QUrl.fromLocalFile(str(p)) for p in paths])
    point = QtCore.QPointF(window.rect().center())
    enter = QtGui.QDragEnterEvent(
        point.toPoint(),
        QtCore.Qt.DropAction.CopyAction,
        mime,
        QtCore.Qt.MouseButton.LeftButton,
        QtCore.Qt.KeyboardModifier.NoModifier,
    )
    QtWidgets.QApplication.sendEvent(window, enter)
    assert enter.isAccepted()
    event = QtGui.QDropEvent(
        point,
        QtCore.Qt.DropAction.CopyAction,
        mime,
        QtCore.Qt.MouseButton.LeftButton,
        QtCore.Qt.KeyboardModifier.NoModifier,
    )
    QtWidgets.QApplication.sendEvent(window, event)


def test_system_prompt_is_reachable_from_the_menu_and_reaches_the_engine(qtbot, store):
    engine = ScriptedEngine(["ok"])
    window = open_window(qtbot, store, engine)
    send(qtbot, window, "hello")
    menu_action(window, "Conversation", "System prompt…").trigger()
    dialog = open_dialog(window, SystemPromptDialog)
    dialog.edit.setPlainText("Answer like a pirate.")
    dialog.accept()
    assert store.get_conversation(window.conversation_id).system_prompt == "Answer like a pirate."
    send(qtbot, window, "again")
    assert engine.calls[-1][0] == {"role": "system", "content": "Answer like a pirate."}

    # Before the first message of a new chat, the prompt waits for the conversation to exist.
    window.new_conversation()
    window.system_prompt_action.trigger()
    dialog = open_dialog(window, SystemPromptDialog)
    dialog.edit.setPlainText("Be brief.")
    dialog.accept()
    send(qtbot, window, "new chat")
    assert store.get_conversation(window.conversation_id).system_prompt == "Be brief."
    assert engine.calls[-1][0]["content"] == "Be brief."


def test_export_from_the_menu_and_import_by_drag_and_drop(qtbot, store, tmp_path):
    window = open_window(qtbot, store, ScriptedEngine(["**Bold** answer"]))
    send(qtbot, window, "Export me")
    target = tmp_path / "chat.md"
    menu_action(window, "Conversation", "Export as Markdown…").trigger()
    dialog = open_dialog(window, QtWidgets.QFileDialog)
    dialog.selectFile(str(target))
    dialog.accept()
    text = target.read_text()
    assert "# Export me" in text and "**Bold** answer" in text
    assert "Exported 1 conversation" in window.statusBar().currentMessage()

    exported = tmp_path / "all.json"
    export_json(store, exported)
    store.delete_conversation(window.conversation_id)  # an export imports what is not here already
    store.purge_deleted()
    drop(window, [exported])
    conversations = store.list_conversations()
    assert len(conversations) == 1 and {c.title for c in conversations} == {"Export me"}
    assert "Imported 1 conversation" in window.statusBar().currentMessage()
    assert window.conversation_id == conversations[0].id
    assert [w.message.text for w in window.chat_view.widgets] == ["Export me", "**Bold** answer"]


def test_import_of_a_file_that_is_not_an_export_says_so(qtbot, store, tmp_path):
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    bad = tmp_path / "notes.json"
    bad.write_text(json.dumps({"hello": 1}))
    window.import_action.trigger()
    dialog = open_dialog(window, QtWidgets.QFileDialog)
    dialog.selectFile(str(bad))
    dialog.accept()
    box = open_dialog(window, QtWidgets.QMessageBox)
    assert "not a Tandem conversation export" in box.text()
    assert store.list_conversations() == []


def test_sidebar_context_menu_exports_and_deletes_with_undo(qtbot, store, tmp_path):
    first = store.create_conversation("First")
    store.add_message(first, "user", "one")
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    menu = window.conversation_actions.conversation_menu(first)
    texts = [a.text() for a in menu.actions() if a.text()]
    assert texts == [
        "Open",
        "Rename",
        "System prompt…",
        "Export as Markdown…",
        "Export as JSON…",
        "Delete (can be undone)",
    ]
    next(a for a in menu.actions() if a.text() == "Export as JSON…").trigger()
    dialog = open_dialog(window, QtWidgets.QFileDialog)
    dialog.selectFile(str(tmp_path / "first.json"))
    dialog.accept()
    assert (
        json.loads((tmp_path / "first.json").read_text())["conversations"][0]["conversation"]["title"]
        == "First"
    )
    next(a for a in menu.actions() if a.text() == "Delete (can be undone)").trigger()
    assert store.list_conversations() == [] and window.sidebar.undo_bar.isVisibleTo(window.sidebar)
    window.sidebar.undo_button.click()
    assert [c.id for c in store.list_conversations()] == [first]


def test_search_shows_one_hit_per_message_and_lands_on_it(qtbot, store):
    conversation = store.create_conversation("Long chat")
    early = store.add_message(conversation, "user", "Where do pelicans nest?")
    for index in range(12):
        store.add_message(conversation, "assistant", "\n\n".join(f"filler {index}.{j}" for j in range(12)))
        store.add_message(conversation, "user", f"next question {index}")
    # The same reply text on two branches of one message: one hit stands for both.
    answer = store.add_message(conversation, "assistant", "Zebras sleep standing up.")
    store.begin_assistant(conversation, parent_id=store.get_message(answer).parent_id)
    twin = store.thread(conversation)[-1].id
    store.finish_message(twin, text="Zebras sleep standing up.")
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))

    window.sidebar.search_box.setText("zebras")
    qtbot.waitUntil(
        lambda: window.sidebar.titles() and window.sidebar.titles()[0].startswith("Long chat\n"), timeout=2000
    )
    assert len(window.sidebar.titles()) == 1
    label = window.sidebar.list.itemWidget(window.sidebar.list.item(0))
    assert (
        "<b>Long chat</b><br>" in label.text()
        and "Zebras</b>" in label.text()
        and "background-color" in label.text()
    )

    window.sidebar.search_box.setText("pelicans")
    qtbot.waitUntil(lambda: window.sidebar.titles()[0].startswith("Long chat\nWhere do"), timeout=2000)
    window.sidebar.list.setCurrentRow(0)
    assert window.conversation_id == conversation
    last = window.chat_view.widgets[-1].message.id
    view = window.chat_view
    # Once every message has its height, the hit is in view and the end of the thread is not.
    qtbot.waitUntil(
        lambda: view.is_message_visible(early) and not view.is_message_visible(last), timeout=3000
    )
    assert view.widget_for(early).selected
    # Scrolled away and clicked again, the same hit brings the message back.
    window.chat_view.scroll.verticalScrollBar().triggerAction(
        QtWidgets.QAbstractSlider.SliderAction.SliderToMaximum
    )
    assert not window.chat_view.is_message_visible(early)
    item = window.sidebar.list.item(0)
    qtbot.mouseClick(
        window.sidebar.list.viewport(),
        QtCore.Qt.MouseButton.LeftButton,
        pos=window.sidebar.list.visualItemRect(item).center(),
    )
    qtbot.waitUntil(lambda: window.chat_view.is_message_visible(early), timeout=3000)


def test_clicking_an_old_reply_brings_back_its_stats(qtbot, store):
    engine = ScriptedEngine(["a", "b", "c", "d"])
    window = open_window(qtbot, store, engine)
    send(qtbot, window, "four")
    engine.tokens = ["x"] * 8
    send(qtbot, window, "eight")
    assert "of 8 drafted" in window.stats_panel.value_text("acceptance")
    assert "just written" in window.stats_panel.caption_text()
    first_reply = window.chat_view.widgets[1]
    qtbot.mouseClick(first_reply.browser.viewport(), QtCore.Qt.MouseButton.LeftButton)
    assert "of 4 drafted" in window.stats_panel.value_text("acceptance")
    assert window.stats_panel.plotted_lengths() == [1.0] * 4 and window.stats_panel.charts_visible()
    assert "clicked" in window.stats_panel.caption_text() and first_reply.selected
    # The footer and the panel agree on the speed.
    assert window.stats_panel.value_text("tokens_per_s") in first_reply.stats_label.text()


def test_copy_confirms_and_help_lists_the_shortcuts(qtbot, store):
    window = open_window(qtbot, store, ScriptedEngine(["copy me"]))
    send(qtbot, window, "hi")
    window.chat_view.widgets[-1].copy_button.click()
    assert QtGui.QGuiApplication.clipboard().text() == "copy me"
    assert window.statusBar().currentMessage() == "Copied to the clipboard."
    qtbot.keyClick(window, QtCore.Qt.Key.Key_F1)
    dialog = open_dialog(window, HelpDialog)
    rows = dict(dialog.rows())
    assert rows["Ctrl+N"] == "New chat" and rows["Esc"] == "Stop" and rows["Ctrl+E"] == "Export as Markdown"


def test_appearance_switch_and_focus_in_the_message_box(qtbot, store):
    conversation = store.create_conversation("Old")
    store.add_message(conversation, "user", "hello")
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    qtbot.waitUntil(lambda: window.focusWidget() is window.message_edit, timeout=2000)
    menu_action(window, "View", "Appearance").menu().actions()[2].trigger()  # Dark
    assert window.appearance == "dark" and store.get_setting("main_window")["appearance"] == "dark"
    plot = window.stats_panel.plots()[0]
    # Qt hands the new palette to each widget through the event loop.
    qtbot.waitUntil(
        lambda: window.chat_view.theme.dark and plot.backgroundBrush().color().lightness() < 80, timeout=2000
    )
    window.set_appearance("light")
    qtbot.waitUntil(
        lambda: not window.chat_view.theme.dark and plot.backgroundBrush().color().lightness() > 200,
        timeout=2000,
    )


def hold_write_lock(path) -> sqlite3.Connection:
    """Another program writing to the database: it holds the write lock until released."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    return conn


def test_locked_database_keeps_the_message_and_says_why(qtbot, store):
    engine = ScriptedEngine(["ok"])
    window = open_window(qtbot, store, engine)
    lock = hold_write_lock(store.path)
    window.message_edit.setPlainText("keep me")
    window.send()
    assert window.reply is None and engine.calls == []
    assert "Could not save your message" in window.storage_banner.text()
    assert window.message_edit.toPlainText() == "keep me"
    lock.execute("ROLLBACK")
    lock.close()
    assert send(qtbot, window, "keep me") == "complete"
    assert not window.storage_banner.isVisibleTo(window)


def test_reply_that_cannot_be_saved_stays_on_screen_and_is_saved_later(qtbot, store):
    engine = ScriptedEngine([f"w{i} " for i in range(40)], delay_s=0.01)
    window = open_window(qtbot, store, engine)
    window.message_edit.setPlainText("go")
    window.send()
    qtbot.waitUntil(lambda: window.reply is not None and len(window.reply.spans) >= 3, timeout=3000)
    lock = hold_write_lock(store.path)
    with qtbot.waitSignal(window.reply_finished, timeout=10000):
        pass
    full = "".join(engine.tokens)
    assert "Could not save the reply" in window.storage_banner.text()
    assert window.chat_view.widgets[-1].message.text == full
    assert window.chat_view.widgets[-1].message.status == "complete"
    reply_id = window.chat_view.widgets[-1].message.id
    assert reply_id in window.unsaved and store.get_message(reply_id).status == "streaming"
    window.open_conversation(window.conversation_id)  # re-reading the thread keeps the text in memory
    assert window.chat_view.widgets[-1].message.text == full
    lock.execute("ROLLBACK")
    lock.close()
    window.storage_banner.retry_button.click()
    saved = store.get_message(reply_id)
    assert (saved.status, saved.content) == ("complete", full) and not window.unsaved
    assert not window.storage_banner.isVisibleTo(window)


def test_conversation_actions_name_exports_after_the_title():
    assert ConversationActions.__init__  # imported for the window; the helper below is pure
    from app.conversation_actions import _safe_name

    assert _safe_name("What's up? / 2") == "What-s-up-2"
    assert _safe_name("???") == "conversation"


def test_the_last_conversation_opens_once_at_start(qtbot, store):

    from app.config import AppConfig
    from app.main_window import MainWindow
    from app.message_widget import MessageWidget

    conversation = store.create_conversation("Old")
    store.add_message(conversation, "user", "hello")
    window = MainWindow(store, AppConfig(), engine_factory=factory_for(ScriptedEngine(["ok"])))
    qtbot.addWidget(window)
    # Before the event loop runs: a second open would leave a first set of widgets awaiting deletion.
    assert len(window.chat_view.container.findChildren(MessageWidget)) == 1
    assert window.conversation_id == conversation


def test_quitting_mid_reply_asks_first_and_keeps_the_text(qtbot, store):
    window, _ = start_long_reply(qtbot, store, words=3000)
    quit_action = menu_action(window, "Chat", "Quit")

    quit_action.trigger()
    box = window.close_question
    assert box is not None and box.isVisible() and window.isVisible()
    keep = next(b for b in box.buttons() if b.text() == "Keep writing")
    keep.click()
    qtbot.waitUntil(lambda: not box.isVisible(), timeout=2000)
    written = len(window.reply.spans)
    qtbot.waitUntil(lambda: len(window.reply.spans) > written + 5, timeout=3000)  # still writing
    assert window.isVisible()

    # (the window manager's close button asks the same: packaging/walkthrough.py presses Alt+F4 under X)


def test_stop_and_quit_in_the_question_closes_the_window(qtbot, store):
    window, _ = start_long_reply(qtbot, store, words=3000)
    menu_action(window, "Chat", "Quit").trigger()
    box = window.close_question
    next(b for b in box.buttons() if b.text() == "Stop and quit").click()
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=3000)
    reply = store.thread(window.conversation_id)[-1]
    assert reply.status == "cancelled" and reply.content.startswith("w0 w1 ")


def test_quitting_without_a_reply_in_progress_asks_nothing(qtbot, store):
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    send(qtbot, window, "hi")
    menu_action(window, "Chat", "Quit").trigger()
    assert window.close_question is None and not window.isVisible()


class OptimizingEngine(ScriptedEngine):
    """Builds "the compiled path" on a thread of its own, as ChatEngine.optimize_in_background does,
    and reports through the same two callbacks; `release` lets it finish."""

    def __init__(self, replies):
        super().__init__(replies)
        self.release = threading.Event()

    def optimize_in_background(self, progress=None, on_done=None) -> bool:
        def build():
            progress("optimizing for this machine", 1, 2)
            self.release.wait(10)
            on_done("Optimized for this machine: a token now takes 22 ms (uncompiled 27 ms), measured.")

        threading.Thread(target=build, daemon=True).start()
        return True


def test_background_optimization_shows_in_the_status_bar_while_replies_go_on(qtbot, store):
    engine = OptimizingEngine(["still answering"])
    window = open_window(qtbot, store, engine)
    qtbot.waitUntil(lambda: window.optimize_label.text().startswith("Optimizing for this machine… 1/2 · "))
    send(qtbot, window, "hi")  # replies go on meanwhile
    assert [m.content for m in store.thread(window.conversation_id)] == ["hi", "still answering"]
    engine.release.set()
    qtbot.waitUntil(lambda: window.optimize_label.text() == "")
    assert (
        window.statusBar().currentMessage().startswith("Optimized for this machine: a token now takes 22 ms")
    )
    assert "uncompiled 27 ms" in window.models_label.toolTip()


class TreeGraphEngine(ScriptedEngine):
    """Left its token-tree graph for after "Ready" (ChatEngine.tree_graph_later); builds it
    when the worker asks, on the worker's thread, and notes which thread that was."""

    def __init__(self, replies):
        super().__init__(replies)
        self.built_on: list[threading.Thread] = []

    def build_tree_graph(self, progress=None) -> bool:
        progress("optimizing for this machine", 0, 1)
        self.built_on.append(threading.current_thread())
        return True


def test_the_tree_graph_is_built_after_ready_off_the_gui_thread(qtbot, store):
    engine = TreeGraphEngine(["answered"])
    window = open_window(qtbot, store, engine)
    qtbot.waitUntil(lambda: window.statusBar().currentMessage().startswith("Token trees ready"))
    assert window.optimize_label.text() == "" and engine.built_on
    assert engine.built_on[0] is not threading.main_thread()
    send(qtbot, window, "hi")
    assert [m.content for m in store.thread(window.conversation_id)] == ["hi", "answered"]


def test_the_smallest_window_shows_the_whole_model_name_beside_the_side_panel(qtbot, store):
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    window.set_side_panel_visible(True)
    window.resize(window.minimumSizeHint())
    combo = window.header.model_combo
    qtbot.waitUntil(lambda: window.width() == window.minimumSizeHint().width(), timeout=2000)
    text = combo.fontMetrics().horizontalAdvance(combo.currentText())
    assert combo.currentText() and combo.width() >= text + 24  # the arrow beside it; it read "smollm2"
