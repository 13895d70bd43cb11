"""The main window with its engine bridge: streaming, stop, storage, search, delete/undo, settings, self-test.

Most tests drive the window with a scripted engine (no torch), so they exercise the threading and the
store writes in milliseconds; one test runs the real built-in pair through `tandem --self-test`.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.bridge import EngineInfo
from app.config import AppConfig
from app.main_window import MainWindow
from app.qt import QObject, Qt, QtWidgets, Slot
from engine.backend import ChatBackend
from engine.errors import ContextOverflowError, ModelNotFoundError
from engine.events import Finished, RoundStats, TextPiece, TokenSpan
from engine.settings import SamplingSettings, SpeculationSettings
from engine.stats import GenerationStats

ROOT = Path(__file__).resolve().parents[1]
# The offscreen platform cannot resize a window to its layout's size hints and says so; that is not ours.
pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")
PROVENANCE_CYCLE = ("draft", "draft", "target", "bonus")


class ScriptedEngine:
    """A ChatBackend (engine/backend.py) like ChatEngine: streams the given tokens, one round per token,
    honouring cancel. test_scripted_engine_is_a_chat_backend keeps it from drifting from the Protocol."""

    def __init__(
        self, tokens: list[str], delay_s: float = 0.0, error: Exception | None = None, stats_every: int = 1
    ):
        self.tokens = tokens
        self.stats_every = stats_every
        self.delay_s = delay_s
        self.error = error
        self.speculation = SpeculationSettings()
        self.sampling = SamplingSettings()
        self.calls: list[list[dict]] = []
        self.thread_names: list[str] = []
        self.prepared = 0

    def prepare(self, progress=None) -> None:
        self.prepared += 1

    @property
    def notices(self) -> list[str]:
        return []

    def respond(self, messages, on_event=None, cancel=None) -> Finished:
        self.calls.append(messages)
        self.thread_names.append(threading.current_thread().name)
        stats = GenerationStats(drafter="model:scripted", k_mode="adaptive", current_k=3)
        stats.prompt_tokens = sum(len(m["content"].split()) for m in messages)  # one token a word, here
        started = time.perf_counter()
        text, ids, reason = "", [], "eos"
        for index, token in enumerate(self.tokens):
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            if self.error is not None and index == 2:
                raise self.error
            if self.delay_s:
                time.sleep(self.delay_s)
            provenance = PROVENANCE_CYCLE[index % len(PROVENANCE_CYCLE)]
            on_event(TextPiece((TokenSpan(index, token, provenance),)))
            text += token
            ids.append(index)
            stats.rounds += 1
            stats.generated_tokens += 1
            stats.drafted += 1
            stats.accepted += provenance == "draft"
            stats.total_time_s = time.perf_counter() - started + 1e-6
            if index % self.stats_every == 0:
                stats.accepted_lengths.append(1)
                on_event(RoundStats(stats))
        return Finished(reason, text, tuple(ids), stats)


class PieceCollector(QObject):
    def __init__(self):
        super().__init__()
        self.pieces: list = []
        self.threads: set[int] = set()

    @Slot(object)
    def collect(self, piece) -> None:
        self.pieces.append(piece)
        self.threads.add(threading.get_ident())


def factory_for(engine: ScriptedEngine, calls: list | None = None):
    def factory(request, progress):
        if calls is not None:
            calls.append(request)
        progress("Loading scripted engine", 1, 2)
        return engine, EngineInfo(request.target, "scripted-draft", "cpu", "int8")

    return factory


def open_window(qtbot, store, engine, calls=None, config: AppConfig | None = None) -> MainWindow:
    # Titles written by the model are tested on their own (test_app_chat.py); elsewhere each first
    # exchange would add a title request to the engine's calls.
    config = config or AppConfig(auto_titles=False)
    window = MainWindow(store, config, engine_factory=factory_for(engine, calls))
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(window.models_loaded, timeout=5000):
        window.load_models()
    return window


def send(qtbot, window: MainWindow, text: str, timeout: int = 5000) -> str:
    window.message_edit.setPlainText(text)
    with qtbot.waitSignal(window.reply_finished, timeout=timeout) as blocker:
        qtbot.keyClick(window.message_edit, Qt.Key.Key_Return)
    return blocker.args[0]


def test_scripted_engine_is_a_chat_backend():
    """The fake and the real engine implement the same Protocol, with the same call signatures."""
    from engine.session import ChatEngine

    fake = ScriptedEngine(["x"])
    assert isinstance(fake, ChatBackend)
    for name in ("prepare", "respond"):
        wanted = list(inspect.signature(getattr(ChatBackend, name)).parameters)
        assert list(inspect.signature(getattr(ScriptedEngine, name)).parameters) == wanted, name
        assert list(inspect.signature(getattr(ChatEngine, name)).parameters) == wanted, name
    assert isinstance(inspect.getattr_static(ScriptedEngine, "notices"), property)
    assert isinstance(fake.speculation, SpeculationSettings) and isinstance(fake.sampling, SamplingSettings)
    result = fake.respond([{"role": "user", "content": "hi"}], on_event=lambda event: None)
    assert isinstance(result, Finished) and result.text == "x"


def test_send_streams_tokens_and_stores_the_reply(qtbot, store):
    tokens = ["Hello", ",", " world", "!"] * 5
    engine = ScriptedEngine(tokens, delay_s=0.005)
    window = open_window(qtbot, store, engine)
    assert "scripted-draft" in window.models_label.text() and "cpu" in window.models_label.text()
    pieces = PieceCollector()
    window.bridge.worker.piece.connect(pieces.collect)

    assert send(qtbot, window, "Say hello") == "complete"

    assert "".join(p.text for p in pieces.pieces) == "".join(tokens)
    assert pieces.threads == {threading.get_ident()}, "signals must arrive on the GUI thread"
    assert engine.thread_names[0] != threading.current_thread().name
    assert engine.calls[0][-1] == {"role": "user", "content": "Say hello"}
    [conversation] = store.list_conversations()
    assert conversation.title == "Say hello"
    user, reply = store.thread(conversation.id)
    assert (user.role, user.content) == ("user", "Say hello")
    assert reply.status == "complete" and reply.content == "".join(tokens)
    assert reply.stats["generated_tokens"] == len(tokens)
    assert reply.stats["provenance_counts"] == {"draft": 10, "target": 5, "bonus": 5}
    assert window.chat_view.widgets[-1].message.text == "".join(tokens)
    assert "20 tokens" in window.chat_view.widgets[-1].stats_label.text()
    assert window.stats_panel.value_text("tokens_per_s") != "—"
    assert window.sidebar.titles() == ["Say hello"]
    # Shift+Enter adds a line instead of sending.
    window.message_edit.setPlainText("two")
    qtbot.keyClick(window.message_edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert window.reply is None and "\n" in window.message_edit.toPlainText()


def test_a_long_first_message_makes_a_short_title():
    from app.main_window import conversation_title

    assert conversation_title("  Say\nhello ") == "Say hello"
    title = conversation_title("Write a Python function that checks whether a number is prime, please")
    assert title == "Write a Python function that checks whether a…" and len(title) <= 48


def test_user_message_is_committed_before_generation(qtbot, store):
    engine = ScriptedEngine(["a"] * 150, delay_s=0.01)
    window = open_window(qtbot, store, engine)
    window.message_edit.setPlainText("first")
    window.send()
    conversation_id = window.conversation_id
    thread = store.thread(conversation_id)
    assert [(m.role, m.status) for m in thread] == [("user", "complete"), ("assistant", "streaming")]
    # Streaming text reaches the database while the reply is still being written.
    qtbot.waitUntil(lambda: len(store.get_message(thread[1].id).content) > 0, timeout=1500)
    assert store.get_message(thread[1].id).status == "streaming"
    qtbot.waitUntil(lambda: window.reply is None, timeout=5000)
    assert store.get_message(thread[1].id).content == "a" * 150


def start_long_reply(qtbot, store, words: int = 2000) -> tuple[MainWindow, ScriptedEngine]:
    """A window writing a reply of `words` words, 10 ms each, with its first ten on screen."""
    engine = ScriptedEngine([f"w{i} " for i in range(words)], delay_s=0.01)
    window = open_window(qtbot, store, engine)
    window.message_edit.setPlainText("Go on forever")
    window.send()
    qtbot.waitUntil(lambda: len(window.reply.spans) >= 10 if window.reply else False, timeout=3000)
    return window, engine


def test_stop_keeps_ui_responsive_and_stores_partial_text_as_cancelled(qtbot, store):
    window, engine = start_long_reply(qtbot, store)
    assert window.send_button.text() == "Stop"

    # Esc only asks the worker to stop: the GUI thread is back at once, in the "Stopping" state, and the
    # end of the reply arrives later through the event loop.
    with qtbot.waitSignal(window.reply_finished, timeout=5000) as blocker:
        qtbot.keyClick(window, Qt.Key.Key_Escape)
        assert window.reply is not None and window.reply.stopping
        assert window.activity_label.text() == "Stopping…" and not window.send_button.isEnabled()
    assert blocker.args == ["cancelled"]

    reply = store.thread(window.conversation_id)[-1]
    assert reply.status == "cancelled"
    assert reply.content.startswith("w0 w1 ") and 0 < len(reply.content) < len("".join(engine.tokens))
    assert reply.stats["finish_reason"] == "cancelled"
    assert window.send_button.text() == "Send"
    assert "stopped" in window.chat_view.widgets[-1].role_label.text()


def test_html_in_model_output_renders_inert(qtbot, store):
    hostile = [
        "<script>alert('x')</script> ",
        '<img src="file:///etc/passwd" onerror="alert(1)"> ',
        "[click](javascript:alert(1)) ",
        "<b>bold?</b>",
    ]
    window = open_window(qtbot, store, ScriptedEngine(hostile))
    assert send(qtbot, window, "be evil") == "complete"
    browser = window.chat_view.widgets[-1].browser
    shown = browser.toPlainText()
    assert "<script>alert('x')</script>" in shown
    assert '<img src="file:///etc/passwd"' in shown
    assert "[click](javascript:alert(1))" in shown
    assert "<b>bold?</b>" in shown
    document_html = browser.toHtml()
    assert "<img" not in document_html and "javascript:" not in document_html.split("</style>", 1)[1].replace(
        "javascript:alert(1))", ""
    )
    assert 'href="javascript' not in document_html


def test_engine_error_shows_in_chat_with_details(qtbot, store):
    engine = ScriptedEngine(["a", "b", "c", "d"], error=ContextOverflowError("The conversation is too long."))
    window = open_window(qtbot, store, engine)
    assert send(qtbot, window, "hi") == "error"
    widget = window.chat_view.widgets[-1]
    assert "The conversation is too long." in widget.browser.toPlainText()
    assert widget.details_button.isVisibleTo(widget)
    reply = store.thread(window.conversation_id)[-1]
    assert reply.status == "error" and reply.content == "ab"
    assert "ContextOverflowError" in reply.stats["error_details"]
    # The window is still usable: the next message goes through.
    engine.error = None
    assert send(qtbot, window, "again") == "complete"


def test_load_failure_and_cancel_are_reported_not_raised(qtbot, store):
    def failing(request, progress):
        raise ModelNotFoundError("No model at 'nowhere'.")

    window = MainWindow(store, AppConfig(), engine_factory=failing)
    qtbot.addWidget(window)
    # Worker signals are waited on through their effect on the window: pytest-qt's waitSignal would
    # run its callback on the worker thread.
    window.load_models()
    qtbot.waitUntil(lambda: window.activity_label.text() == "Loading failed", timeout=5000)
    box = next(w for w in QtWidgets.QApplication.topLevelWidgets() if isinstance(w, QtWidgets.QMessageBox))
    assert box.text() == "No model at 'nowhere'." and "ModelNotFoundError" in box.detailedText()
    assert not box.isModal()  # the window stays usable behind it
    assert window.bridge.info is None
    window.message_edit.setPlainText("hello")
    window.send()
    assert window.reply is None and store.list_conversations() == []

    gate = threading.Event()

    def slow(request, progress):
        progress("Stage one", 0, 2)
        gate.wait(5)
        progress("Stage two", 1, 2)
        return ScriptedEngine(["x"]), EngineInfo("t", None, "cpu", "none")

    window2 = MainWindow(store, AppConfig(), engine_factory=slow)
    qtbot.addWidget(window2)
    window2.load_models()
    progress = window2.loading.progress  # in the status bar, not a dialog
    qtbot.waitUntil(lambda: "Stage one" in progress.text(), timeout=3000)
    assert not [d for d in window2.findChildren(QtWidgets.QDialog) if d.isVisible()]
    progress.cancel_button.click()
    gate.set()
    qtbot.waitUntil(lambda: progress.isHidden(), timeout=3000)
    assert window2.bridge.info is None and "cancelled" in window2.activity_label.text()


def test_search_finds_a_message_and_opens_its_conversation(qtbot, store):
    first = store.create_conversation("Cooking")
    store.add_message(first, "user", "How long do I boil an egg?")
    second = store.create_conversation("Decoding")
    store.add_message(second, "user", "Explain speculative decoding")
    store.add_message(second, "assistant", "A small drafter proposes tokens the target verifies.")
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    assert window.sidebar.titles() == ["Decoding", "Cooking"]

    qtbot.keyClick(window, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert window.sidebar.search_box.hasFocus()
    qtbot.keyClicks(window.sidebar.search_box, "drafter")
    qtbot.waitUntil(lambda: window.sidebar.titles()[0].startswith("Decoding\n"), timeout=2000)
    assert len(window.sidebar.titles()) == 1 and "drafter" in window.sidebar.titles()[0]
    window.sidebar.list.setCurrentRow(0)
    assert window.conversation_id == second
    assert any("drafter proposes" in w.message.text for w in window.chat_view.widgets)

    window.sidebar.search_box.clear()
    qtbot.waitUntil(lambda: window.sidebar.titles() == ["Decoding", "Cooking"], timeout=2000)


def test_delete_then_undo_and_rename(qtbot, store):
    keep = store.create_conversation("Keep me")
    store.add_message(keep, "user", "hello")
    gone = store.create_conversation("Delete me")
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    window.sidebar.select(gone)
    window.sidebar.delete_button.click()
    assert window.sidebar.titles() == ["Keep me"]
    assert window.sidebar.undo_bar.isVisibleTo(window.sidebar)
    assert [c.id for c in store.list_conversations()] == [keep]

    window.sidebar.undo_button.click()
    assert sorted(window.sidebar.titles()) == ["Delete me", "Keep me"]
    assert window.conversation_id == gone and not window.sidebar.undo_bar.isVisibleTo(window.sidebar)

    window.sidebar.select(keep)
    item = window.sidebar.list.currentItem()
    item.setText("Renamed")
    qtbot.waitUntil(lambda: store.get_conversation(keep).title == "Renamed", timeout=2000)

    window.sidebar.select(gone)
    window.sidebar.delete_selected()
    window.close()  # deletions become final when the window closes
    assert [c.id for c in store.list_conversations(include_deleted=True)] == [keep]


def test_regenerate_and_edit_keep_branches(qtbot, store):
    engine = ScriptedEngine(["one"])
    window = open_window(qtbot, store, engine)
    send(qtbot, window, "question")
    first_reply = window.chat_view.widgets[-1].message.id
    engine.tokens = ["two"]
    with qtbot.waitSignal(window.reply_finished, timeout=5000):
        window.chat_view.widgets[-1].action_button.click()
    thread = store.thread(window.conversation_id)
    assert [m.content for m in thread] == ["question", "two"]
    assert window.chat_view.widgets[-1].message.branch == (2, 2)
    window.switch_branch(thread[-1].id, -1)
    assert window.chat_view.widgets[-1].message.id == first_reply

    engine.tokens = ["three"]
    window.chat_view.widgets[0].action_button.click()  # Edit the question
    assert window.message_edit.toPlainText() == "question"
    window.message_edit.setPlainText("better question")
    with qtbot.waitSignal(window.reply_finished, timeout=5000):
        window.send()
    assert [m.content for m in store.thread(window.conversation_id)] == ["better question", "three"]
    assert window.chat_view.widgets[0].message.branch == (2, 2)
    assert engine.calls[-1][-1]["content"] == "better question"


def test_settings_apply_without_restart(qtbot, store):
    engine = ScriptedEngine(["ok"])
    calls: list = []
    window = open_window(qtbot, store, engine, calls)
    assert len(calls) == 1
    changed = AppConfig(k_mode="fixed", k=5, temperature=0.7, auto_titles=False)
    window.apply_config(changed)
    send(qtbot, window, "hi")
    assert len(calls) == 1, "sampling and K changes must not reload models"
    assert engine.speculation.k == 5 and engine.sampling.temperature == 0.7
    assert AppConfig.load(store).k == 5

    window.apply_config(
        AppConfig(k_mode="fixed", k=5, temperature=0.7, target="/models/other", auto_titles=False)
    )
    qtbot.waitUntil(lambda: len(calls) == 2, timeout=5000)
    assert calls[-1].target == "/models/other", "another target loads"


def test_a_drafter_change_applies_at_the_next_reply_without_a_load(qtbot, store):
    """auto -> n-gram -> auto: the engine reads the drafter at every reply; the draft model stays loaded."""
    engine = ScriptedEngine(["ok"])
    calls: list = []
    window = open_window(qtbot, store, engine, calls)
    assert window.config.drafter == "auto" and len(calls) == 1
    window.apply_config(AppConfig(drafter="ngram", auto_titles=False))
    send(qtbot, window, "hi")
    assert engine.speculation.drafter == "ngram"
    window.apply_config(AppConfig(drafter="auto", auto_titles=False))
    send(qtbot, window, "again")
    assert engine.speculation.drafter == "auto"
    assert len(calls) == 1, "a drafter change must not load models"


def test_a_context_chosen_in_settings_reloads_and_sizes_the_real_engines_cache(qtbot, store, tiny_model_dir):
    """The app's own factory on a tiny model folder (its own context: 1,024 tokens): the engine holds
    the context chosen, never more than the model's own, and the context meter shows the engine's figure."""
    from app.engine_factory import default_engine_factory
    from app.settings_dialog import SettingsDialog

    requests, engines = [], []

    def factory(request, progress):
        requests.append(request)
        engine, info = default_engine_factory(request, progress)
        engines.append(engine)
        return engine, info

    config = AppConfig(
        target=str(tiny_model_dir),
        draft="",
        drafter="none",
        device="cpu",
        compiled="off",
        context=512,
        auto_titles=False,
    )
    window = MainWindow(store, config, engine_factory=factory)
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(window.models_loaded, timeout=120_000):
        window.load_models()
    assert requests[-1].context == 512 and engines[-1].context_length == 512
    assert window.header.context_text().endswith("/ 512 tokens")

    qtbot.keyClick(window, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)
    dialog = window.findChild(SettingsDialog)
    assert dialog.w.context_spin.value() == 512
    dialog.w.context_spin.setValue(4096)
    with qtbot.waitSignal(window.models_loaded, timeout=120_000):
        dialog.ok_button.click()  # applies once the target's check answers
    assert len(requests) == 2, "a new context loads the engine again"
    assert requests[-1].context == 4096 and AppConfig.load(store).context == 4096
    assert engines[-1].target.context_length == 1024  # the tiny model's own
    assert engines[-1].context_length == min(4096, 1024)
    assert window.header.context_text().endswith("/ 1,024 tokens")
    window.close()


def test_shortcuts_and_layout_persist_in_store(qtbot, store):
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    send(qtbot, window, "hello")
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.conversation_id is None and window.chat_view.widgets == []
    assert [a.shortcut().toString() for a in (window.settings_action, window.stop_action)] == [
        "Ctrl+,",
        "Esc",
    ]
    window.splitter.setSizes([200, 700, 280])
    sizes = window.splitter.sizes()
    window.chat_view.set_coloured(True)
    window.close()
    assert store.get_setting("main_window")["splitter"] == sizes

    again = MainWindow(store, AppConfig(), engine_factory=factory_for(ScriptedEngine(["ok"])))
    qtbot.addWidget(again)
    again.show()
    # The offscreen screen is 800 px wide, so the restored window is clamped; the sidebar keeps its width.
    assert again.splitter.sizes()[0] == sizes[0]
    assert again.chat_view.coloured


def test_many_signals_across_threads_exit_cleanly(tmp_path):
    """20,000 token signals from the worker, then a normal exit: PySide6 6.12 on Python 3.11 crashes here."""
    script = tmp_path / "many_signals.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "from app.qt import QtWidgets, QObject, Slot\n"
        "from app.bridge import EngineBridge, EngineInfo, LoadRequest\n"
        "from test_app import ScriptedEngine\n"
        "app = QtWidgets.QApplication([])\n"
        "engine = ScriptedEngine(['x'] * 20000, stats_every=500)\n"
        "bridge = EngineBridge(lambda request, progress: (engine, EngineInfo('t', None, 'cpu', 'none')))\n"
        "class Counter(QObject):\n"
        "    pieces = 0\n"
        "    @Slot(object)\n"
        "    def piece(self, _):\n"
        "        self.pieces += 1\n"
        "    @Slot(object)\n"
        "    def loaded(self, _):\n"
        "        bridge.respond([{'role': 'user', 'content': 'go'}])\n"
        "    @Slot(object)\n"
        "    def done(self, result):\n"
        "        self.result = result\n"
        "        app.quit()\n"
        "counter = Counter()\n"
        "bridge.worker.piece.connect(counter.piece)\n"
        "bridge.worker.loaded.connect(counter.loaded)\n"
        "bridge.worker.finished.connect(counter.done)\n"
        "bridge.load(LoadRequest('t'))\n"
        "app.exec()\n"
        "assert bridge.shutdown()\n"
        "assert counter.pieces == 20000, counter.pieces\n"
        "assert len(counter.result.text) == 20000\n"
        "print('signals ok', counter.pieces)\n"
    )
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "signals ok 20000" in done.stdout


def tandem_command() -> list[str]:
    """The installed `tandem` console script, or its equivalent from the source tree."""
    script = Path(sys.executable).with_name("tandem")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from app.main import main; sys.exit(main())"]


@pytest.mark.slow
def test_self_test_passes_with_the_builtin_pair(tmp_path):
    pytest.importorskip("engine.session")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "TANDEM_DATA_DIR": str(tmp_path / "data")}
    shot = tmp_path / "self-test.png"
    done = subprocess.run(
        [*tandem_command(), "--self-test", "--screenshot", str(shot)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "self-test passed" in done.stdout
    assert shot.stat().st_size > 10_000


def test_version_and_missing_display(tmp_path):
    command = tandem_command()
    version = subprocess.run([*command, "--version"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert version.returncode == 0 and version.stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")}
    headless = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert headless.returncode == 2
    assert "tandem-cli chat" in headless.stderr


def test_crash_report_is_shown_once(tmp_path):
    from app import crash

    (tmp_path / crash.FATAL_LOG).write_text("Fatal Python error: Segmentation fault\n")
    report = crash.take_report(tmp_path)
    assert report is not None and "Segmentation fault" in report
    assert crash.take_report(tmp_path) is None


@pytest.fixture(autouse=True)
def _close_message_boxes(qtbot):
    yield
    for widget in QtWidgets.QApplication.topLevelWidgets():
        if isinstance(widget, QtWidgets.QMessageBox):
            widget.close()


def test_ctrl_comma_opens_settings_and_applied_reaches_the_engine(qtbot, store):
    from app.settings_dialog import SettingsDialog

    engine = ScriptedEngine(["ok"])
    window = open_window(qtbot, store, engine)
    qtbot.keyClick(window, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)
    dialog = window.findChild(SettingsDialog)
    assert dialog is not None and dialog.isVisible()
    dialog.applied.emit(AppConfig(k_mode="fixed", k=3, auto_titles=False))
    dialog.close()
    send(qtbot, window, "hi")
    assert engine.speculation.k == 3


def test_the_engines_background_build_may_outlive_the_window(qtbot):
    """The engine's optimizing thread reports through the worker's signals; when the window (and so
    the worker) is gone first, its report must go nowhere instead of raising in that thread."""
    import shiboken6

    from app.bridge import LoaderWorker, _emit_while_alive

    worker = LoaderWorker(factory=None)
    heard: list[str] = []
    worker.optimized.connect(heard.append)
    report = _emit_while_alive(worker.optimized)
    report("compiled")
    assert heard == ["compiled"]
    signal = worker.optimized
    shiboken6.delete(worker)
    with pytest.raises(RuntimeError):  # what the thread used to die of
        signal.emit("compiled")
    report("compiled")  # nobody to tell, and no error
    assert heard == ["compiled"]
