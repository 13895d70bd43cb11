"""Walk through the app as a new user does, on a real X server, saving a screenshot after each step.

It starts from an empty cache and config (no converted model, no built kernels, no calibration) while a
busy loop per core keeps the machine loaded, types the first message as soon as the window shows, and
goes on: a drafter change (the status bar naming it), send, stop, regenerate, edit, search, export,
delete and import, settings with a bad path, quit mid-reply, restart; then Settings' Models page with its
context field, the model manager listing a hub repository's GGUF files with their fit (a local fake hub,
tests/fake_hub.py: nothing goes online), and a long pasted message read with its progress shown. Input
goes through Qt's test events (key presses, mouse clicks and a paste on the real widgets); the models are
the built-in pair; the database is a fresh one in a temporary folder.

It records the time to the window, to the first answer and to full speed (the compiled path in use),
how long a drafter change takes to apply, and every figure the stats panel and the footer show for
each reply (packaging/walkthrough_checks.py); it fails where two figures for the same thing disagree.
The newer steps record what they saw (the context field, the hub files' fit, the reading progress and
the prompt speed, the status bar after the drafter change).
Each step saves packaging/screenshots/walkthrough-*.png; the README's main-window-light.png / -dark.png /
-formatted-dark.png come from the same run, and walkthrough-report.json holds the times and figures.

    packaging/walkthrough.sh [OUT_DIR]      # starts Xvfb + openbox and runs this
    python packaging/walkthrough.py OUT_DIR # on a display you already have
        --warm    keep the user's cache and config     --quiet   no busy loops beside it

Exit status 0 when every step did what it should; otherwise the failing step is printed.

Longer than usual because it is one script of some forty steps, each a few lines, read top to bottom.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "packaging"))

import walkthrough_checks as checks  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402

from app.config import AppConfig  # noqa: E402
from app.main_window import MainWindow  # noqa: E402
from app.qt import QObject, Qt, QtCore, QtGui, QTimer, QtWidgets  # noqa: E402
from engine.store.database import Store  # noqa: E402

FIRST_PROMPT = "Write a Python function that checks whether a number is prime, with a short explanation."
LONG_PROMPT = "Tell me a long story about a lighthouse keeper and a storm."
EDITED_PROMPT = "Write a short Python function that checks whether a number is even."
DRAFTER_PROMPT = "Now list three prime numbers and say why each is prime."
STEP_TIMEOUT_S = 1200  # a first start or a reply on a busy 2-core machine can take many minutes
FULL_SPEED_LIMIT_S = 900  # how long the end waits for the compiled path before saying it never came
# replies long enough to show drafting, short enough for a 2-core machine; TANDEM_WALKTHROUGH_TOKENS overrides
MAX_NEW_TOKENS = int(os.environ.get("TANDEM_WALKTHROUGH_TOKENS", "96"))
POLL_MS = 100
HUB_REPO = "acme/Walkthrough-GGUF"  # served by the local fake hub (tests/fake_hub.py): no network
HUB_SMALL = "Walkthrough-Q4_1.gguf"  # the built-in target's own file: fits anywhere Tandem runs
HUB_MIDDLE = "Walkthrough-Q8_0.gguf"
HUB_TOO_BIG = "Walkthrough-F16.gguf"  # listed larger than this machine's memory


def build_long_message(paragraphs: int = 64) -> str:
    """A long message to paste, some thousands of tokens: a keeper's log of varied entries (weather,
    repairs, a supply list, a snippet of the tide-table script, talk with the boatman), then a question."""
    import random

    rng = random.Random(20240611)
    winds = ["north-west", "south", "east by north", "south-south-west", "west", "north-east"]
    skies = ["low cloud", "a clear sky", "drizzle from the west", "sea fog until noon", "hail showers"]
    repairs = [
        "re-seated the lamp's second burner",
        "greased the clockwork that turns the lens",
        "replaced two cracked panes in the lantern room",
        "painted the iron railing on the gallery",
        "cleared salt from the fog-horn's reed",
        "mended the hinge of the oil store door",
    ]
    supplies = ["paraffin", "wicks", "lamp glass", "rope", "tar", "flour", "tea", "candles", "nails"]
    visitors = ["the boatman", "the inspector", "a fisherman from Carrick", "the doctor's daughter"]
    sayings = [
        "said the herring had moved further out this year",
        "asked whether the new lens would be fitted before winter",
        "brought letters and a newspaper three days old",
        "wanted to know how many ships passed in the night",
    ]
    parts = ["Here are my notes from the lighthouse log. Please read them all before you answer."]
    for day in range(1, paragraphs + 1):
        kind = day % 4
        hour, minute = rng.randint(4, 9), rng.choice([0, 10, 20, 30, 40, 50])
        if kind == 0:
            text = (
                f"Day {day}. High tide at {hour:02d}:{minute:02d}, {rng.uniform(1.2, 4.8):.1f} m. "
                f"Wind {rng.choice(winds)} at {rng.randint(4, 38)} knots, {rng.choice(skies)}. "
                f"The barometer read {rng.randint(968, 1036)} hPa and {rng.choice(['fell', 'rose', 'held'])} "
                f"through the afternoon. {rng.randint(2, 19)} vessels passed, one of them a steamer."
            )
        elif kind == 1:
            text = (
                f"Day {day}. I {' and '.join(rng.sample(repairs, 2))}. The work took "
                f"{rng.randint(2, 7)} hours; the lamp was lit at {hour + 12}:{minute:02d} as always."
            )
        elif kind == 2:
            wanted = rng.sample(supplies, 4)
            text = (
                f"Day {day}. Supplies to order: "
                + ", ".join(f"{rng.randint(2, 40)} {item}" for item in wanted)
                + f". Cost last month came to {rng.randint(3, 12)} pounds {rng.randint(0, 19)} shillings."
            )
        else:
            visitor = rng.choice(visitors)
            text = (
                f"Day {day}. {visitor[0].upper() + visitor[1:]} came at {hour + 6}:{minute:02d} and "
                f"{rng.choice(sayings)}. I asked about the storm in {rng.choice(['March', 'October'])}; "
                "the answer was that the waves reached the second window, which I doubt."
            )
        parts.append(text)
        if day == paragraphs // 2:
            parts.append(
                "The tide-table script I keep for the almanac:\n"
                "def tides(first, hours=12.42):\n"
                "    return [first + i * hours for i in range(4)]\n"
                "print(tides(5.5))"
            )
    parts.append("Which repair did I make most often? Answer in one or two sentences.")
    return "\n\n".join(parts)


LONG_MESSAGE = build_long_message()

Step = Callable[[], Callable[[], bool] | None]  # does something; returns what to wait for (or None)


class Walkthrough(QObject):
    def __init__(self, app: QtWidgets.QApplication, db_path: Path, out_dir: Path, work: Path):
        super().__init__()
        self.app, self.db_path, self.out_dir, self.work = app, db_path, out_dir, work
        self.store = Store(db_path)
        AppConfig(max_new_tokens=MAX_NEW_TOKENS).save(self.store)
        self.window: MainWindow | None = None
        self.failure: str | None = None
        self.log: list[str] = []
        self.timeline = checks.Timeline()
        self.figures: list[dict] = []
        self.problems: list[str] = []
        self.drafter_changes_s: list[float] = []
        self.observed: dict[str, object] = {}  # what the newer steps saw, for the report
        self.steps: list[tuple[str, Step]] = [
            ("first start", self.first_start),
            ("type at once", self.send_first),
            ("shot: first message waits", lambda: self.shoot("01-first-start")),
            ("first answer", self.first_answer),
            ("shot: reply", lambda: self.shoot("02-reply")),
            ("readme shots", self.readme_shots),
            ("drafter change", lambda: self.change_drafter("ngram")),
            ("shot: drafter changed", self.shoot_sampling),
            ("reply with the new drafter", self.send_with_new_drafter),
            ("drafter back", lambda: self.change_drafter("auto", then_stats=True)),
            ("stop", self.send_long),
            ("press Esc", self.press_escape),
            ("shot: stopped", lambda: self.shoot("03-stopped")),
            ("regenerate", self.regenerate),
            ("shot: regenerated", lambda: self.shoot("04-regenerated")),
            ("edit", self.edit_first),
            ("shot: edited", lambda: self.shoot("05-edited")),
            ("search", self.search),
            ("shot: search", lambda: self.shoot("06-search")),
            ("open the hit", self.open_hit),
            ("shot: hit", lambda: self.shoot("07-search-hit")),
            ("click an old reply", self.click_old_reply),
            ("shot: old reply stats", lambda: self.shoot("08-old-reply-stats")),
            ("export", self.export),
            ("shot: export dialog", self.shoot_export_dialog),
            ("save the export", self.accept_export),
            ("check the export", self.check_export),
            ("delete the chat", self.delete_chat),
            ("import", self.import_by_drop),
            ("shot: imported", lambda: self.shoot("10-imported")),
            ("quit mid-reply", lambda: self.send_long(enough=2)),
            ("press Alt+F4", self.close_by_window_manager),
            ("shot: quit question", self.shoot_screen_area),
            ("keep writing", self.keep_writing),
            ("settings with a bad path", self.bad_settings),
            ("shot: settings refused", self.shoot_settings),
            ("cancel settings", self.cancel_settings),
            ("full speed", self.wait_for_full_speed),
            ("restart", self.restart),
            ("shot: after restart", lambda: self.shoot("12-restart")),
            ("settings: the Models page", self.open_settings_models),
            ("shot: context field", self.shoot_settings_context),
            ("model manager: a hub repository", self.list_hub_files),
            ("shot: hub files", self.shoot_hub_files),
            ("paste a long message", self.paste_long_message),
            ("shot: reading the message", self.shoot_reading),
            ("reply to the long message", self.long_message_answered),
            ("shot: prompt read", self.shoot_prompt_read),
            ("dark", self.dark),
            ("shot: dark", lambda: self.shoot("13-dark")),
            ("finish", self.finish),
        ]
        self.index = -1
        self.stepping = False
        self.waiting: Callable[[], bool] | None = None
        self.step_started = 0.0
        self.timer = QTimer(self)
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.tick)

    # --- the step machine ------------------------------------------------------------------------

    def start(self) -> None:
        self.timer.start()
        self.next_step()

    def next_step(self) -> None:
        self.index += 1
        if self.index >= len(self.steps):
            self.timer.stop()
            return
        name, step = self.steps[self.index]
        print(f"step: {name}", flush=True)
        self.step_started = time.monotonic()
        self.stepping = True  # a step that lets events through (settle) must not start the next one
        try:
            self.waiting = step()
        except Exception as exc:  # noqa: BLE001 - a walkthrough reports, then stops
            self.fail(f"{name}: {type(exc).__name__}: {exc}")
        finally:
            self.stepping = False

    def tick(self) -> None:
        if self.failure is not None or self.stepping:
            return
        if self.window is not None and "full speed" not in self.timeline.marks and self.at_full_speed():
            self.timeline.mark("full speed")
        if self.waiting is not None:
            try:
                done = self.waiting()
            except Exception as exc:  # noqa: BLE001
                self.fail(f"{self.steps[self.index][0]}: {type(exc).__name__}: {exc}")
                return
            if not done:
                if time.monotonic() - self.step_started > STEP_TIMEOUT_S:
                    self.fail(f"{self.steps[self.index][0]}: nothing happened in {STEP_TIMEOUT_S} s")
                return
            self.waiting = None
        self.next_step()

    def fail(self, message: str) -> None:
        self.failure = message
        print(f"walkthrough FAILED at {message}", flush=True)
        self.shoot("failure")
        self.timer.stop()
        self.app.quit()

    def shoot(self, name: str, widget: QtWidgets.QWidget | None = None) -> None:
        self.settle()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        target = widget or self.window
        if target is None:
            return
        path = self.out_dir / f"walkthrough-{name}.png"
        target.grab().save(str(path))
        print(f"wrote {path}", flush=True)

    def settle(self, ms: int = 300) -> None:
        end = time.monotonic() + ms / 1000
        while time.monotonic() < end:
            self.app.processEvents()

    # --- helpers ---------------------------------------------------------------------------------

    def open_window(self) -> MainWindow:
        window = MainWindow(self.store, AppConfig.load(self.store))
        window.resize(1400, 880)
        window.show()
        self.finished: list[str] = []
        window.reply_finished.connect(self.finished.append)
        window.reply_finished.connect(lambda _status: self.record_figures())
        self.loaded = False
        window.models_loaded.connect(lambda _info: setattr(self, "loaded", True))
        window.models_loaded.connect(lambda _info: self.timeline.mark("models loaded"))
        window.bridge.worker.piece.connect(lambda _piece: self.timeline.mark("first token"))
        self.settings_applied_at: float | None = None
        window.bridge.worker.settings_applied.connect(
            lambda: setattr(self, "settings_applied_at", time.monotonic())
        )
        return window

    def record_figures(self) -> None:
        """After each reply: every figure the panel and its footer show, and where two disagree."""
        widget = self.window.chat_view.widget_for(
            self.window.store.thread(self.window.conversation_id)[-1].id
        )
        if widget is None or widget.message.role != "assistant":
            return
        figures = checks.figures_of(self.window, widget)
        found = checks.disagreements(figures)
        stats = widget.message.stats or {}
        used = (stats.get("prompt_tokens") or 0) + (stats.get("generated_tokens") or 0)
        if stats.get("generated_tokens") and not self.window.header.context_text().startswith(f"{used:,} "):
            found.append(f"context used: stats {used:,}, meter {self.window.header.context_text()!r}")
        figures["disagreements"] = found
        self.figures.append(figures)
        self.problems += found
        print(f"figures: {figures['panel']} | footer {figures['footer']!r}", flush=True)
        for problem in found:
            print(f"DISAGREE: {problem}", flush=True)

    def at_full_speed(self) -> bool:
        """The engine runs its compiled path, or has none to build here (and nothing builds now)."""
        engine = getattr(self.window.bridge.worker, "_engine", None)
        if engine is None or not self.loaded:
            return False
        if getattr(engine, "runs_compiled", False):
            return True
        optimizer = getattr(engine, "_optimizer", None)
        may_compile = getattr(engine, "_may_compile_later", lambda: False)()
        return (
            not may_compile
            and (optimizer is None or not optimizer.is_alive())
            and not self.window.optimize_label.text()
        )

    def type_and_send(self, text: str) -> None:
        edit = self.window.message_edit
        edit.setFocus()
        QTest.keyClicks(edit, text)
        QTest.keyClick(edit, Qt.Key.Key_Return)

    def reply_done(self, count: int) -> Callable[[], bool]:
        return lambda: len(self.finished) >= count

    def click(self, widget: QtWidgets.QWidget) -> None:
        QTest.mouseClick(widget, Qt.MouseButton.LeftButton)

    # --- the steps -------------------------------------------------------------------------------

    def first_start(self):
        """The window, and the models loading behind it; a new user types at once."""
        self.window = self.open_window()
        self.window.load_models()
        self.settle(100)
        self.timeline.mark("window")
        return None

    def send_first(self):
        self.type_and_send(FIRST_PROMPT)
        self.timeline.mark("first message sent")
        if self.loaded:
            self.log.append("the models were ready before the first message: nothing waited")
            return None
        waiting = self.window.chat_view.widgets[-1].message.status == "waiting"
        if not waiting:
            raise RuntimeError("a message sent before the model was ready did not wait visibly")
        self.settle(1500)  # the status bar's progress moves on a little
        return None

    def first_answer(self):
        def answered() -> bool:
            if self.finished:
                self.timeline.mark("first answer")
                return True
            return False

        return answered

    def change_drafter(self, drafter: str, then_stats: bool = False):
        """The drafter, in the side panel: it must apply without a load, in well under a second."""
        panel = self.window.sampling_panel
        self.window.side_panel.setCurrentWidget(panel)
        self.settings_applied_at = None
        started = time.monotonic()
        panel.drafter_combo.setCurrentIndex(panel.drafter_combo.findData(drafter))
        if self.window.loading.busy:
            raise RuntimeError(f"changing the drafter to {drafter} started a load")

        def applied() -> bool:
            if self.settings_applied_at is None:
                return False
            seconds = round(self.settings_applied_at - started, 3)
            self.drafter_changes_s.append(seconds)
            print(f"time: drafter change to {drafter} applied in {seconds} s", flush=True)
            if then_stats:
                self.window.side_panel.setCurrentWidget(self.window.stats_panel)
            return True

        return applied

    def shoot_sampling(self):
        """The side panel with the new drafter, and the status bar naming it (the window's grab holds both)."""
        from app.stats_format import describe_drafter

        self.shoot("02b-drafter-changed")
        status = self.window.models_label.text()
        self.observed["status_bar_after_drafter_change"] = status
        self.window.side_panel.setCurrentWidget(self.window.stats_panel)
        if f"Drafter: {describe_drafter('ngram')}" not in status:
            raise RuntimeError(f"after the drafter change the status bar says {status!r}")

    def send_with_new_drafter(self):
        self.type_and_send(DRAFTER_PROMPT)
        count = len(self.finished) + 1

        def done() -> bool:
            if len(self.finished) < count:
                return False
            drafter = (self.window.store.thread(self.window.conversation_id)[-1].stats or {}).get("drafter")
            if drafter != "ngram":
                raise RuntimeError(
                    f"the reply after the drafter change used {drafter!r}, not the n-gram drafter"
                )
            return True

        return done

    def readme_shots(self):
        """The README's pictures: this reply, token colouring on, light and dark; formatted dark."""
        window = self.window
        for name, mode, coloured in (
            ("light", "light", True),
            ("dark", "dark", True),
            ("formatted-dark", "dark", False),
        ):
            window.set_appearance(mode, save=False)
            window.chat_view.set_coloured(coloured)
            self.settle(500)
            path = self.out_dir / f"main-window-{name}.png"
            window.grab().save(str(path))
            print(f"wrote {path}", flush=True)
        window.set_appearance("light", save=False)
        window.chat_view.set_coloured(False)
        return None

    def send_long(self, enough: int = min(25, MAX_NEW_TOKENS // 3)):  # midway, even with short replies
        self.type_and_send(LONG_PROMPT)
        return lambda: self.window.reply is not None and len(self.window.reply.spans) >= enough

    def press_escape(self):
        count = len(self.finished) + 1
        QTest.keyClick(self.window, Qt.Key.Key_Escape)
        return lambda: len(self.finished) >= count and self.finished[-1] == "cancelled"

    def regenerate(self):
        widget = self.window.chat_view.widgets[-1]
        count = len(self.finished) + 1
        self.click(widget.action_button)  # "Regenerate" on the stopped reply
        return lambda: len(self.finished) >= count

    def edit_first(self):
        first_user = next(w for w in self.window.chat_view.widgets if w.message.role == "user")
        self.click(first_user.action_button)  # "Edit"
        edit = self.window.message_edit
        edit.selectAll()
        QTest.keyClick(edit, Qt.Key.Key_Delete)
        count = len(self.finished) + 1
        self.type_and_send(EDITED_PROMPT)
        return lambda: len(self.finished) >= count

    def search(self):
        QTest.keyClick(self.window, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
        QTest.keyClicks(self.window.sidebar.search_box, "lighthouse")
        return lambda: any(t.count("\n") for t in self.window.sidebar.titles())

    def open_hit(self):
        sidebar = self.window.sidebar
        rect = sidebar.list.visualItemRect(sidebar.list.item(0))
        QTest.mouseClick(sidebar.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
        return lambda: self.window.conversation_id is not None

    def click_old_reply(self):
        sidebar = self.window.sidebar
        sidebar.search_box.clear()
        self.settle(400)
        replies = [
            w for w in self.window.chat_view.widgets if w.message.role == "assistant" and w.message.stats
        ]
        if replies:
            QTest.mouseClick(replies[0].browser.viewport(), Qt.MouseButton.LeftButton)
        return None

    def export(self):
        self.window.export_markdown_action.trigger()
        return lambda: self.file_dialog() is not None

    def file_dialog(self) -> QtWidgets.QFileDialog | None:
        dialogs = [d for d in self.window.findChildren(QtWidgets.QFileDialog) if d.isVisible()]
        return dialogs[0] if dialogs else None

    def shoot_export_dialog(self):
        self.file_dialog().selectFile(str(self.work / "conversation.md"))
        self.shoot("09-export-dialog", self.file_dialog())

    def accept_export(self):
        self.file_dialog().accept()
        return lambda: any("# " in path.read_text() for path in self.work.glob("*.md"))

    def check_export(self):
        markdown = next(self.work.glob("*.md")).read_text(encoding="utf-8")
        found = checks.export_disagreements(markdown, self.figures)
        self.problems += found
        for problem in found:
            print(f"DISAGREE: {problem}", flush=True)

    def wait_for_full_speed(self):
        """Before the restart: the compiled path built in the background (or none due here)."""
        started = time.monotonic()

        def reached() -> bool:
            if "full speed" in self.timeline.marks:
                return True
            if time.monotonic() - started > FULL_SPEED_LIMIT_S:
                self.log.append(f"full speed not reached {FULL_SPEED_LIMIT_S} s after the other steps")
                return True
            return False

        return reached

    def delete_chat(self):
        """Save the conversations as JSON, then delete the chat (a conversation already here is not
        imported twice): the drop that follows brings it back. Waits for the undo bar to go."""
        exported = self.work / "conversations.json"
        self.window.conversation_actions.export_to("json", None, exported)
        json.loads(exported.read_text())
        self.click(self.window.sidebar.delete_button)
        bar = self.window.sidebar.undo_bar
        if not bar.isVisible():
            raise RuntimeError("Delete left no undo bar")
        return lambda: not bar.isVisible()

    def import_by_drop(self):
        exported = self.work / "conversations.json"
        before = len(self.store.list_conversations())
        mime = QtCore.QMimeData()
        mime.setUrls([QtCore.QUrl.fromLocalFile(str(exported))])
        centre = self.window.rect().center()
        actions, button, modifiers = (
            Qt.DropAction.CopyAction,
            Qt.MouseButton.LeftButton,
            Qt.KeyboardModifier.NoModifier,
        )
        QtWidgets.QApplication.sendEvent(
            self.window, QtGui.QDragEnterEvent(centre, actions, mime, button, modifiers)
        )
        QtWidgets.QApplication.sendEvent(
            self.window, QtGui.QDropEvent(QtCore.QPointF(centre), actions, mime, button, modifiers)
        )
        return lambda: len(self.store.list_conversations()) > before

    def close_by_window_manager(self):
        """Alt+F4 through the window manager (openbox): the close a user makes, not a call from code."""
        import subprocess

        window_id = str(int(self.window.winId()))
        subprocess.run(["xdotool", "windowactivate", "--sync", window_id], check=True, timeout=10)
        self.quit_count = len(self.finished) + 1  # the reply the question interrupts
        subprocess.run(["xdotool", "key", "--clearmodifiers", "alt+F4"], check=True, timeout=10)

        def asked() -> bool:
            question = self.window.close_question
            if question is None or not question.isVisible():
                return False
            self.asked_mid_reply = len(self.finished) < self.quit_count
            return True

        return asked

    def shoot_screen_area(self):
        """The window with the question over it: a grab of the screen, since the box is a window of its own."""
        self.settle()
        frame = self.window.frameGeometry()
        shot = self.window.screen().grabWindow(0, frame.x(), frame.y(), frame.width(), frame.height())
        path = self.out_dir / "walkthrough-11a-quit-mid-reply.png"
        shot.save(str(path))
        print(f"wrote {path}", flush=True)
        if not self.window.isVisible() or not self.asked_mid_reply:
            raise RuntimeError("the window closed mid-reply without asking")

    def keep_writing(self):
        box = self.window.close_question
        self.click(next(button for button in box.buttons() if button.text() == "Keep writing"))
        return lambda: len(self.finished) >= self.quit_count and self.window.isVisible()

    def settings_dialog(self):
        from app.settings_dialog import SettingsDialog

        dialogs = [d for d in self.window.findChildren(SettingsDialog) if d.isVisible()]
        return dialogs[0] if dialogs else None

    def bad_settings(self):
        QTest.keyClick(self.window, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)
        self.settle(500)
        dialog = self.settings_dialog()
        combo = dialog.target_picker.combo
        combo.lineEdit().selectAll()
        QTest.keyClicks(combo.lineEdit(), "/no/such/model-folder")
        self.settle(1500)  # the dialog checks the path in the background
        ok = dialog.ok_button
        if ok.isEnabled():
            self.click(ok)
        return lambda: True

    def shoot_settings(self):
        dialog = self.settings_dialog()
        if dialog is not None:
            self.shoot("11-settings-bad-path", dialog)
        else:
            self.shoot("11-settings-bad-path")
        self.log.append(f"after the bad path, the status bar says: {self.window.models_label.text()!r}")

    def cancel_settings(self):
        dialog = self.settings_dialog()
        if dialog is not None:
            dialog.reject()
        boxes = [
            w
            for w in QtWidgets.QApplication.topLevelWidgets()
            if isinstance(w, QtWidgets.QMessageBox) and w.isVisible()
        ]
        for box in boxes:
            self.shoot("11b-load-error", box)
            box.close()
        return None

    def restart(self):
        self.window.close()  # waits for the engine thread; the database stays open, as after a real quit
        self.settle(300)
        self.window.deleteLater()
        restarted = time.monotonic()
        self.window = self.open_window()
        self.window.load_models()

        def ready() -> bool:
            if self.loaded:
                self.log.append(f"a restart loaded the models in {time.monotonic() - restarted:.1f} s")
                self.problems.extend(checks.context_disagreements(self.window))
            return self.loaded or "failed" in self.window.activity_label.text()

        return ready

    def open_settings_models(self):
        """Settings (Ctrl+,) opens on its Models page: the context field, and the memory it costs."""
        QTest.keyClick(self.window, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)
        self.settle(300)
        dialog = self.settings_dialog()
        if dialog is None:
            raise RuntimeError("Ctrl+, opened no Settings dialog")
        dialog.resize(dialog.width(), 940)  # taller, as on this 1000-pixel screen: the memory line shows too
        dialog.tabs.setCurrentIndex(0)
        dialog.tabs.currentWidget().ensureWidgetVisible(dialog.context_spin)
        return lambda: dialog.memory_label.text().startswith(("Needs about", "Could not"))

    def shoot_settings_context(self):
        dialog = self.settings_dialog()
        self.shoot("12b-settings-context", dialog)
        spin = dialog.context_spin
        self.observed["settings_context"] = {
            "tab": dialog.tabs.tabText(dialog.tabs.currentIndex()),
            "context_field": spin.text(),
            "memory_line": dialog.memory_label.text(),
        }
        if spin.value() != self.window.config.context or not spin.isVisible():
            raise RuntimeError(
                f"the context field shows {spin.text()!r}, the app uses {self.window.config.context}"
            )
        dialog.reject()

    def list_hub_files(self):
        """Chat ▸ Models…: a hub repository's GGUF files (the local fake hub), each judged at the context."""
        from app.model_manager import ModelManager

        self.window.models_action.trigger()
        self.settle(300)
        manager = next(d for d in self.window.findChildren(ModelManager) if d.isVisible())
        manager.resize(1400, 900)  # as a user enlarges it on this screen: every hub file's row shows
        self.listed: list[str] = []
        manager.hub_listed.connect(self.listed.append)
        manager.hub_repo_edit.setFocus()
        QTest.keyClicks(manager.hub_repo_edit, HUB_REPO)
        self.click(manager.hub_list_button)
        return lambda: bool(self.listed)

    def shoot_hub_files(self):
        from app.model_manager import ModelManager

        manager = next(d for d in self.window.findChildren(ModelManager) if d.isVisible())
        if self.listed[0]:
            raise RuntimeError(f"listing {HUB_REPO} failed: {self.listed[0]}")
        self.shoot("12c-model-manager-hub", manager)
        table = manager.hub_table
        headers = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
        rows = [
            dict(zip(headers, (table.item(r, c).text() for c in range(table.columnCount())), strict=True))
            for r in range(table.rowCount())
        ]
        self.observed["hub_files"] = {
            "repository": HUB_REPO,
            "context": manager.hub_context.text(),
            "rows": rows,
            "status": manager.status_label.text(),
        }
        verdicts = {row["File"]: row["Fits here"] for row in rows}
        if verdicts.get(HUB_SMALL) != "fits" or verdicts.get(HUB_TOO_BIG) != "won't fit":
            raise RuntimeError(f"the hub files' fit reads {verdicts}")
        manager.close()

    def paste_long_message(self):
        """A new chat, a long message pasted (Ctrl+V) and sent: its reading shows in the reply's place."""
        self.click(self.window.sidebar.new_button)  # a click: a key could reach the manager as it closes
        self.settle(300)
        if self.window.chat_view.widgets:
            raise RuntimeError("New chat left the last conversation in view")
        QtWidgets.QApplication.clipboard().setText(LONG_MESSAGE)
        edit = self.window.message_edit
        edit.setFocus()
        QTest.keyClick(edit, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
        if edit.toPlainText() != LONG_MESSAGE:
            raise RuntimeError("the pasted message did not reach the message box whole")
        self.long_count = len(self.finished) + 1
        QTest.keyClick(edit, Qt.Key.Key_Return)
        return lambda: " left" in self.reading_text() or len(self.finished) >= self.long_count

    def reading_text(self) -> str:
        streaming = self.window.chat_view.streaming
        return streaming.message.extra.get("reading", "") if streaming is not None else ""

    def shoot_reading(self):
        if len(self.finished) >= self.long_count:
            raise RuntimeError("the long message was read before its progress could be seen")
        self.settle(50)  # the grab must come while the reading goes on
        path = self.out_dir / "walkthrough-12d-long-message-reading.png"
        self.window.grab().save(str(path))
        reading, meter = self.reading_text(), self.window.header.context_text()  # as grabbed
        print(f"wrote {path}", flush=True)
        self.observed["long_message"] = {
            "characters": len(LONG_MESSAGE),
            "reading": reading,
            "context_meter_while_reading": meter,
        }
        if not reading.startswith("Reading your message: "):
            raise RuntimeError(f"the reply's placeholder says {reading!r} while the message is read")

    def long_message_answered(self):
        return lambda: len(self.finished) >= self.long_count

    def shoot_prompt_read(self):
        self.shoot("12e-long-message-read")
        widget = self.window.chat_view.widgets[-1]
        stats = widget.message.stats or {}
        footer = widget.stats_label.text()
        self.observed["long_message"].update(
            footer=footer,
            context_meter_after=self.window.header.context_text(),
            prompt_tokens=stats.get("prompt_tokens"),
            prefill_tokens=stats.get("prefill_tokens"),
        )
        if "prompt read at " not in footer:
            raise RuntimeError(f"the long message's reply does not say how fast it was read: {footer!r}")

    def dark(self):
        self.window.set_appearance("dark")
        return None

    def finish(self):
        self.window.set_appearance("system")
        self.window.close()
        self.index = len(self.steps)  # every step ran: the step machine stops here, not in next_step
        self.timer.stop()
        self.app.quit()
        return None


def start_fake_hub():
    """The local server the tests use, answering as the Hugging Face hub does, with one repository of
    GGUF files; HF_ENDPOINT points at it (read at each listing), so the walkthrough never goes online."""
    from engine.models.builtin import DEFAULT_TARGET, builtin_entry, builtin_gguf_path
    from tests.fake_hub import FakeHub

    data = builtin_gguf_path(builtin_entry(DEFAULT_TARGET)).read_bytes()
    header = data[: 1024 * 1024]  # the larger files are listed, never downloaded: their header is enough
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    listed = {HUB_MIDDLE: len(data) * 17 // 10, HUB_TOO_BIG: memory * 5 // 4}

    class ListedHub(FakeHub):
        def info(self, repo: str, blobs: bool) -> dict:
            info = super().info(repo, blobs)
            for sibling in info["siblings"]:
                if blobs and sibling["rfilename"] in listed:
                    sibling["size"] = sibling["lfs"]["size"] = listed[sibling["rfilename"]]
            return info

    hub = ListedHub()
    hub.add(HUB_REPO, {HUB_SMALL: data, HUB_MIDDLE: header, HUB_TOO_BIG: header})
    hub.start()
    os.environ["HF_ENDPOINT"] = hub.url
    os.environ.pop("HF_HUB_OFFLINE", None)
    return hub


def main(out_dir: Path, fresh: bool = True, loaded: bool = True) -> int:
    environment = checks.fresh_environment() if fresh else None
    hub = start_fake_hub()
    hogs = checks.start_cpu_hogs() if loaded else []
    app = QtWidgets.QApplication(sys.argv[:1])
    app.setStyle("Fusion")
    app.setQuitOnLastWindowClosed(False)  # the restart step closes the only window before opening the next
    try:
        with tempfile.TemporaryDirectory(prefix="tandem-walkthrough-") as folder:
            work = Path(folder)
            walk = Walkthrough(app, work / "walkthrough.db", out_dir, work)
            QTimer.singleShot(0, walk.start)
            app.exec()
            walk.store.close()
    finally:
        checks.stop_cpu_hogs(hogs)
        hub.stop()
        if environment is not None:
            environment.cleanup()
    marks = walk.timeline.marks
    extra = {
        "fresh_cache": fresh,
        "busy_loops": len(hogs),
        "cores": os.cpu_count(),
        "drafter_change_s": walk.drafter_changes_s,
        **walk.observed,
        "notes": walk.log,
    }
    checks.write_report(
        out_dir / "walkthrough-report.json", walk.timeline, walk.figures, walk.problems, extra
    )
    for line in walk.log:
        print(line)
    print(f"times (s from start): {marks}; drafter changes applied in {walk.drafter_changes_s} s")
    if walk.failure:
        return 1
    if walk.index < len(walk.steps):
        print(f"walkthrough FAILED: it stopped at step {walk.index + 1} of {len(walk.steps)}")
        return 1
    if walk.problems:
        print(f"walkthrough FAILED: {len(walk.problems)} figures disagree: {walk.problems}")
        return 1
    print("walkthrough passed")
    return 0


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if not a.startswith("--")]
    sys.exit(
        main(
            Path(arguments[0]) if arguments else ROOT / "packaging" / "screenshots",
            fresh="--warm" not in sys.argv,
            loaded="--quiet" not in sys.argv,
        )
    )
