"""Chat as LM Studio, Jan and GPT4All users expect it: nothing modal before the first message, a model
switch that keeps the old model answering, the model switcher and the context meter above the chat,
the mark of an own system prompt, titles from the first exchange, editing a reply, the stats panel
that follows the reply in view and folds away, sampling beside the chat, and a stopped reply that
keeps its figures after a restart. A real window offscreen, a real SQLite file, a scripted engine."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from test_app import ScriptedEngine, factory_for, open_window, send, start_long_reply

from app.bridge import EngineInfo
from app.config import AppConfig
from app.main_window import MainWindow
from app.qt import Qt, QtCore, QtWidgets

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")
GATE_S = 20  # a gated load waits at most this long; the tests open the gate well before


@pytest.fixture(autouse=True)
def _close_dialogs(qtbot):
    yield
    for widget in QtWidgets.QApplication.topLevelWidgets():
        if isinstance(widget, (QtWidgets.QMessageBox, QtWidgets.QDialog)) and widget.isVisible():
            widget.close()


def status_text(window) -> str:
    return " ".join(label.text() for label in window.statusBar().findChildren(QtWidgets.QLabel))


def visible_dialogs(window) -> list:
    return [d for d in window.findChildren(QtWidgets.QDialog) if d.isVisible()]


def gated_factory(engines: dict, gate: threading.Event, gated: set[str], context_length: int | None = None):
    """Engines by target; a gated target's load reports a stage, then waits for the gate."""

    def factory(request, progress):
        if request.target in gated:
            progress("Building Tandem's CPU kernels for this machine (once)", 0, 1)
            gate.wait(GATE_S)
        return engines[request.target], EngineInfo(
            request.target, "scripted-draft", "cpu", "int8", context_length=context_length
        )

    return factory


# --- 1. chat within seconds of a first start --------------------------------------------------------


def test_a_message_sent_before_the_model_is_ready_waits_visibly_and_is_answered(qtbot, store):
    gate = threading.Event()
    engine = ScriptedEngine(["Hello", "!"])
    factory = gated_factory({"t": engine}, gate, {"t"})
    window = MainWindow(store, AppConfig(target="t", draft="t", auto_titles=False), engine_factory=factory)
    qtbot.addWidget(window)
    window.show()
    window.load_models()
    qtbot.waitUntil(lambda: "Building Tandem's CPU kernels" in status_text(window), timeout=5000)
    assert visible_dialogs(window) == []  # nothing modal between the window and the first message

    window.message_edit.setPlainText("Are you there?")
    qtbot.keyClick(window.message_edit, Qt.Key.Key_Return)
    assert window.message_edit.toPlainText() == ""  # the box is free for the next message
    [user] = store.thread(window.conversation_id)
    assert (user.role, user.content) == ("user", "Are you there?")
    waiting = window.chat_view.widgets[-1]
    assert waiting.message.status == "waiting" and "waiting for the model" in waiting.role_label.text()
    assert window.send_button.text() == "Cancel"

    with qtbot.waitSignal(window.reply_finished, timeout=10_000) as finished:
        gate.set()
    assert finished.args == ["complete"]
    assert [(m.role, m.content) for m in store.thread(window.conversation_id)] == [
        ("user", "Are you there?"),
        ("assistant", "Hello!"),
    ]
    assert engine.calls[0][-1]["content"] == "Are you there?"


def test_a_waiting_message_that_never_got_its_reply_can_be_answered_later(qtbot, store):
    gate = threading.Event()
    engine = ScriptedEngine(["Late", " answer"])
    factory = gated_factory({"t": engine}, gate, {"t"})
    window = MainWindow(store, AppConfig(target="t", draft="t", auto_titles=False), engine_factory=factory)
    qtbot.addWidget(window)
    window.show()
    window.load_models()
    window.message_edit.setPlainText("Question")
    window.send()
    window.stop_action.trigger()  # Esc: stop waiting; the question stays, unanswered
    question = window.chat_view.widgets[-1]
    assert question.message.role == "user" and question.answer_button.isVisibleTo(question)
    with qtbot.waitSignal(window.models_loaded, timeout=10_000):
        gate.set()
    with qtbot.waitSignal(window.reply_finished, timeout=5000):
        question.answer_button.click()
    assert store.thread(window.conversation_id)[-1].content == "Late answer"


def test_load_progress_gives_counts_and_an_estimate_of_the_time_left():
    from app.load_progress import StageClock

    clock = StageClock()
    clock.update("Converting the model", 0, 10, now=0.0)
    assert clock.remaining_s(1.0) is None and clock.text(1.0) == "Converting the model… 0/10 · 1 s"
    clock.update("Converting the model", 4, 10, now=8.0)
    assert clock.remaining_s(8.0) == pytest.approx(12.0)  # 4 steps in 8 s: 6 more take 12 s
    assert clock.text(8.0) == "Converting the model… 4/10 · about 12 s left"
    clock.update("Building Tandem's CPU kernels (once)", 0, 1, now=9.0)  # one step: no estimate
    assert clock.text(84.0) == "Building Tandem's CPU kernels (once)… · 1 min 15 s"


# --- 2. settings apply at once; a new model loads beside the old one --------------------------------


def test_the_old_model_answers_while_the_new_one_loads(qtbot, store):
    gate = threading.Event()
    engines = {"a": ScriptedEngine(["from", " A"]), "b": ScriptedEngine(["from", " B"])}
    factory = gated_factory(engines, gate, {"b"})
    window = MainWindow(store, AppConfig(target="a", draft="a", auto_titles=False), engine_factory=factory)
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.models_loaded, timeout=5000):
        window.load_models()
    window.apply_config(dataclasses.replace(window.config, target="b", draft="b"))
    qtbot.waitUntil(lambda: "Building" in status_text(window), timeout=5000)

    assert send(qtbot, window, "Who answers?") == "complete"  # while b is still loading
    assert store.thread(window.conversation_id)[-1].content == "from A" and engines["b"].calls == []
    with qtbot.waitSignal(window.models_loaded, timeout=10_000):
        gate.set()
    send(qtbot, window, "And now?")
    assert store.thread(window.conversation_id)[-1].content == "from B"


def test_the_model_switcher_above_the_chat_loads_the_chosen_model(qtbot, store):
    calls: list = []
    window = open_window(qtbot, store, ScriptedEngine(["ok"]), calls)
    header = window.header
    header.add_models(["builtin:smollm2-135m-instruct", "/models/other"])
    assert header.current_model() == window.config.target
    index = header.model_combo.findData("/models/other")
    with qtbot.waitSignal(window.models_loaded, timeout=5000):
        header.model_combo.activated.emit(index)  # what choosing it in the list does
    assert calls[-1].target == "/models/other"
    assert calls[-1].draft == "/models/other"  # a draft that copied the old target follows the new one
    assert header.current_model() == "/models/other" and window.config.target == "/models/other"


def test_sampling_beside_the_chat_applies_to_the_next_reply_without_a_load(qtbot, store):
    engine = ScriptedEngine(["ok"])
    calls: list = []
    window = open_window(qtbot, store, engine, calls)
    panel = window.sampling_panel
    panel.sampling.temperature_spin.setValue(0.8)
    panel.drafter_combo.setCurrentIndex(panel.drafter_combo.findData("ngram"))
    send(qtbot, window, "hi")
    assert engine.sampling.temperature == 0.8 and engine.speculation.drafter == "ngram"
    assert len(calls) == 1 and AppConfig.load(store).temperature == 0.8
    window.open_settings()  # the dialog opens on what the panel set
    dialog = visible_dialogs(window)[0]
    assert dialog.sampling.temperature_spin.value() == 0.8


# --- 5. what LM Studio, Jan and GPT4All users expect ---------------------------------------------


def test_the_context_meter_counts_the_conversation_against_the_models_context(qtbot, store):
    engine = ScriptedEngine(["one ", "two ", "three"])
    factory = gated_factory({"t": engine}, threading.Event(), set(), context_length=8192)
    window = MainWindow(store, AppConfig(target="t", draft="t", auto_titles=False), engine_factory=factory)
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.models_loaded, timeout=5000):
        window.load_models()
    assert window.header.context_text() == "0 / 8,192 tokens"
    send(qtbot, window, "count these four words")
    stats = store.thread(window.conversation_id)[-1].stats
    used = stats["prompt_tokens"] + stats["generated_tokens"]
    assert window.header.context_text() == f"{used:,} / 8,192 tokens"
    assert window.header.context_bar.value() == used and window.header.context_bar.maximum() == 8192
    window.new_conversation()
    assert window.header.context_text() == "0 / 8,192 tokens"
    window.sidebar.select(store.list_conversations()[0].id)
    assert window.header.context_text() == f"{used:,} / 8,192 tokens"


def test_a_conversation_with_its_own_system_prompt_is_marked(qtbot, store):
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    send(qtbot, window, "hello")
    chip = window.header.prompt_chip
    assert not chip.isVisibleTo(window)  # the default prompt: no mark
    window.conversation_actions._set_system_prompt(window.conversation_id, "Answer like a pirate.")
    assert chip.isVisibleTo(window) and "pirate" in chip.toolTip()
    window.new_conversation()
    assert not chip.isVisibleTo(window)
    window.sidebar.select(store.list_conversations()[0].id)
    assert chip.isVisibleTo(window)


def test_a_conversation_is_titled_from_its_first_exchange(qtbot, store):
    from app.titles import TITLE_INSTRUCTION

    engine = ScriptedEngine(["Pelican ", "nesting ", "habits"])
    window = open_window(qtbot, store, engine, config=AppConfig())
    send(qtbot, window, "where do those big birds with the pouch build their nests, do you know?")
    conversation_id = window.conversation_id
    qtbot.waitUntil(
        lambda: store.get_conversation(conversation_id).title == "Pelican nesting habits", timeout=5000
    )
    assert window.sidebar.titles() == ["Pelican nesting habits"]
    request = engine.calls[-1]
    assert request[-1]["content"] == TITLE_INSTRUCTION and request[-2]["content"] == "Pelican nesting habits"
    calls = len(engine.calls)
    send(qtbot, window, "and the second message")
    assert len(engine.calls) == calls + 1  # only the first exchange asks for a title

    # a conversation the user renamed meanwhile keeps the user's name
    window.new_conversation()
    engine.tokens = ["Some ", "title"]
    window.message_edit.setPlainText("another chat")
    with qtbot.waitSignal(window.reply_finished, timeout=5000):
        window.send()
    store.rename_conversation(window.conversation_id, "Mine")
    qtbot.wait(200)
    assert store.get_conversation(window.conversation_id).title == "Mine"


def test_a_drafter_change_does_not_wait_for_a_title_being_written(qtbot, store):
    """The title of a first exchange is written on the engine thread; settings go first, then it."""
    from app.titles import first_message_title

    engine = ScriptedEngine(["word "] * 150, delay_s=0.01)
    window = open_window(qtbot, store, engine, config=AppConfig())
    send(qtbot, window, "Tell me about zebras")
    conversation_id = window.conversation_id
    titles_when_applied = TitleAtSettings(store, conversation_id)
    window.bridge.worker.settings_applied.connect(titles_when_applied.record)
    window.apply_config(dataclasses.replace(window.config, drafter="ngram"))
    qtbot.waitUntil(lambda: bool(titles_when_applied.titles), timeout=5000)
    assert titles_when_applied.titles == [first_message_title("Tell me about zebras")]  # before the title
    qtbot.waitUntil(
        lambda: store.get_conversation(conversation_id).title.startswith("word word"), timeout=10_000
    )
    assert engine.speculation.drafter == "ngram"


class TitleAtSettings(QtCore.QObject):
    """Lives on the GUI thread: the conversation's title at the moment the engine took new settings."""

    def __init__(self, store, conversation_id: int):
        super().__init__()
        self.store, self.conversation_id, self.titles = store, conversation_id, []

    @QtCore.Slot()
    def record(self) -> None:
        self.titles.append(self.store.get_conversation(self.conversation_id).title)


@pytest.mark.parametrize(
    "answer, title",
    [
        ('Title: "Pelican Nests"\nThe rest', "Pelican Nests"),
        ('Here\'s a possible title:\n\n"Checking Primes in Python"', "Checking Primes in Python"),
        ("Sure! Here is a title for it.\nPrime checks", "Prime checks"),
        ("**Speculative decoding explained.**", "Speculative decoding explained"),
        ("   \n...", ""),
    ],
)
def test_a_models_answer_is_cleaned_into_a_title(answer, title):
    from app.titles import clean_title

    assert clean_title(answer) == title


def test_an_assistant_message_can_be_edited_and_keeps_its_original(qtbot, store):
    from app.message_edit import ReplyEditDialog

    engine = ScriptedEngine(["The ", "capital ", "is ", "Lyon."])
    window = open_window(qtbot, store, engine)
    send(qtbot, window, "Capital of France?")
    reply = window.chat_view.widgets[-1]
    reply.edit_button.click()
    dialog = next(d for d in visible_dialogs(window) if isinstance(d, ReplyEditDialog))
    assert dialog.text() == "The capital is Lyon."
    dialog.edit.setPlainText("The capital is Paris.")
    dialog.accept()
    edited = window.chat_view.widgets[-1]
    assert edited.message.text == "The capital is Paris." and edited.message.branch == (2, 2)
    assert "edited" in edited.role_label.text() and not edited.stats_label.isVisibleTo(edited)
    send(qtbot, window, "Sure?")
    assert {"role": "assistant", "content": "The capital is Paris."} in engine.calls[-1]
    original = store.siblings(edited.message.id)[0]
    assert original.content == "The capital is Lyon." and original.stats["generated_tokens"] == 4


def test_the_stats_panel_follows_the_reply_a_search_or_a_branch_switch_brings_into_view(qtbot, store):
    engine = ScriptedEngine(["Zebras ", "sleep ", "standing ", "up"])  # 4 tokens: 2 of 4 drafted kept
    window = open_window(qtbot, store, engine)
    send(qtbot, window, "How do zebras sleep?")
    engine.tokens = ["x "] * 8
    send(qtbot, window, "And horses?")
    panel = window.stats_panel
    assert "of 8 drafted" in panel.value_text("acceptance")

    window.sidebar.search_box.setText("standing")
    qtbot.waitUntil(lambda: window.sidebar.titles()[0].count("\n") == 1, timeout=3000)
    window.sidebar.list.setCurrentRow(0)  # jump to the first reply
    assert "of 4 drafted" in panel.value_text("acceptance")
    assert window.chat_view.widgets[1].selected

    window.sidebar.search_box.clear()
    qtbot.waitUntil(lambda: window.sidebar.titles() == [store.get_conversation(window.conversation_id).title])
    engine.tokens = ["y "] * 6
    with qtbot.waitSignal(window.reply_finished, timeout=5000):
        window.chat_view.widgets[-1].action_button.click()  # regenerate: a second version
    assert "of 6 drafted" in panel.value_text("acceptance")
    window.switch_branch(window.chat_view.widgets[-1].message.id, -1)  # back to the first version
    assert "of 8 drafted" in panel.value_text("acceptance")
    assert window.chat_view.widgets[-1].selected
    # a reply clicked for its figures brings them forward, even from the Sampling tab
    window.side_panel.setCurrentWidget(window.sampling_panel)
    qtbot.mouseClick(window.chat_view.widgets[1].browser.viewport(), Qt.MouseButton.LeftButton)
    assert window.side_panel.currentWidget() is panel and "of 4 drafted" in panel.value_text("acceptance")


def test_the_side_panel_folds_away_and_stays_so(qtbot, store):
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    window.show()
    assert window.side_panel.isVisibleTo(window)
    window.header.side_button.click()
    assert not window.side_panel.isVisibleTo(window) and not window.side_panel_action.isChecked()
    window.close()
    again = MainWindow(store, AppConfig(), engine_factory=factory_for(ScriptedEngine(["ok"])))
    qtbot.addWidget(again)
    again.show()
    assert not again.side_panel.isVisibleTo(again) and not again.header.side_button.isChecked()
    again.side_panel_action.trigger()
    assert again.side_panel.isVisibleTo(again)


# --- 6. a stopped reply keeps its footer --------------------------------------------------------------


def test_a_reply_stopped_by_quitting_shows_its_stats_after_a_restart(qtbot, store):
    window, _engine = start_long_reply(qtbot, store)
    conversation_id = window.conversation_id
    window.close()  # Quit while writing: the reply stops and is kept
    reply = store.thread(conversation_id)[-1]
    assert reply.status == "cancelled" and reply.stats.get("generated_tokens", 0) >= 10

    again = MainWindow(store, AppConfig(), engine_factory=factory_for(ScriptedEngine(["ok"])))
    qtbot.addWidget(again)
    again.sidebar.select(conversation_id)
    footer = again.chat_view.widgets[-1].stats_label
    assert footer.isVisibleTo(again.chat_view.widgets[-1]) and "tokens" in footer.text()


def test_quitting_while_a_message_waits_for_the_model_keeps_it(qtbot, store):
    gate = threading.Event()
    factory = gated_factory({"t": ScriptedEngine(["x"])}, gate, {"t"})
    window = MainWindow(store, AppConfig(target="t", draft="t", auto_titles=False), engine_factory=factory)
    qtbot.addWidget(window)
    window.load_models()
    window.message_edit.setPlainText("Kept?")
    window.send()
    QtCore.QTimer.singleShot(200, gate.set)  # the loader stops at its next stage
    window.close()
    assert [(m.role, m.content) for m in store.thread(window.conversation_id)] == [("user", "Kept?")]


# --- a long message is read with visible progress ------------------------------------------------


def test_a_long_message_shows_how_far_it_is_read_and_the_reply_is_unchanged(qtbot, store, make_tiny):
    """A real ChatEngine on a tiny model: a message of more than one prefill chunk shows "Reading your
    message: … of … tokens" in the reply's placeholder and the prompt's size in the context meter while
    it is read, and the reply is the one the same engine writes with nobody listening."""
    from engine.session import ChatEngine

    target = make_tiny(seed=0)
    engine = ChatEngine(target, compiled="off")
    asked: list[list[dict]] = []
    respond = engine.respond

    def recording(messages, on_event=None, cancel=None):
        asked.append(messages)
        return respond(messages, on_event, cancel)

    engine.respond = recording

    def factory(request, progress):
        info = EngineInfo(request.target, None, "cpu", "fp32", context_length=engine.context_length)
        return engine, info

    config = AppConfig(target="tiny", draft="", drafter="ngram", max_new_tokens=8, auto_titles=False)
    window = MainWindow(store, config, engine_factory=factory)
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.models_loaded, timeout=30000):
        window.load_models()
    seen: list[tuple[str, str]] = []  # the placeholder's text and the context meter's, at each report

    class Looker(QtCore.QObject):
        """On the GUI thread, connected after the window's own slot: sees what each report showed. (A
        plain function would run on the worker's thread as the report is sent, before the window.)"""

        @QtCore.Slot(object)
        def look(self, _progress) -> None:
            widget = window.chat_view.streaming
            seen.append((widget.browser.toPlainText() if widget else "", window.header.context_text()))

    looker = Looker(window)
    window.bridge.worker.reading.connect(looker.look)
    assert send(qtbot, window, "The cat sat on the mat. " * 100, timeout=120000) == "complete"

    prompt_tokens = len(engine.prompt_ids(asked[0]))
    assert prompt_tokens > 512  # more than one chunk
    assert seen and seen[0][0].startswith(f"Reading your message: 0 of {prompt_tokens:,} tokens")
    assert any(
        text.startswith(f"Reading your message: 512 of {prompt_tokens:,} tokens · about ") for text, _ in seen
    )
    assert all(meter == f"{prompt_tokens:,} / {engine.context_length:,} tokens" for _, meter in seen)
    reply = store.thread(window.conversation_id)[-1]
    quiet = ChatEngine(make_tiny(seed=0), compiled="off")
    quiet.speculation, quiet.sampling = engine.speculation, engine.sampling
    assert reply.content == quiet.respond(asked[0]).text and reply.content
    assert window.stats_panel.value_text("prompt_speed").startswith("prompt read at ")
    assert "prompt read at " in window.chat_view.widgets[-1].stats_label.text()
