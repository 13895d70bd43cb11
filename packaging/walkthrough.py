"""Walk through the app as a new user does, on a real X server, saving a screenshot after each step.

It starts from an empty cache and config (no converted model, no built kernels, no calibration) while a
busy loop per core keeps the machine loaded, types the first message as soon as the window shows, and
goes on: a drafter change, send, stop, regenerate, edit, search, export, import, settings with a bad
path, quit mid-reply, restart. Input goes through Qt's test events (key presses and mouse clicks on the
real widgets); the models are the built-in pair; the database is a fresh one in a temporary folder.

It records the time to the window, to the first answer and to full speed (the compiled path in use),
how long a drafter change takes to apply, and every figure the stats panel and the footer show for
each reply (packaging/walkthrough_checks.py); it fails where two figures for the same thing disagree.
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
            ("import", self.import_by_drop),
            ("shot: imported", lambda: self.shoot("10-imported")),
            ("quit mid-reply", self.send_long),
            ("press Alt+F4", self.close_by_window_manager),
            ("shot: quit question", self.shoot_screen_area),
            ("keep writing", self.keep_writing),
            ("settings with a bad path", self.bad_settings),
            ("shot: settings refused", self.shoot_settings),
            ("cancel settings", self.cancel_settings),
            ("full speed", self.wait_for_full_speed),
            ("restart", self.restart),
            ("shot: after restart", lambda: self.shoot("12-restart")),
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
        self.shoot("02b-drafter-changed")
        self.window.side_panel.setCurrentWidget(self.window.stats_panel)

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

    def send_long(self):
        self.type_and_send(LONG_PROMPT)
        enough = min(25, MAX_NEW_TOKENS // 3)  # stop midway, even with short replies
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

    def import_by_drop(self):
        exported = self.work / "conversations.json"
        self.window.conversation_actions.export_to("json", None, exported)
        before = len(self.store.list_conversations())
        json.loads(exported.read_text())
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
        subprocess.run(["xdotool", "key", "--clearmodifiers", "alt+F4"], check=True, timeout=10)
        return lambda: self.window.close_question is not None and self.window.close_question.isVisible()

    def shoot_screen_area(self):
        """The window with the question over it: a grab of the screen, since the box is a window of its own."""
        self.settle()
        frame = self.window.frameGeometry()
        shot = self.window.screen().grabWindow(0, frame.x(), frame.y(), frame.width(), frame.height())
        path = self.out_dir / "walkthrough-11a-quit-mid-reply.png"
        shot.save(str(path))
        print(f"wrote {path}", flush=True)
        if not self.window.isVisible() or self.window.reply is None:
            raise RuntimeError("the window closed mid-reply without asking")

    def keep_writing(self):
        box = self.window.close_question
        self.click(next(button for button in box.buttons() if button.text() == "Keep writing"))
        count = len(self.finished) + 1
        return lambda: len(self.finished) >= count and self.window.isVisible()

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


def main(out_dir: Path, fresh: bool = True, loaded: bool = True) -> int:
    environment = checks.fresh_environment() if fresh else None
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
        if environment is not None:
            environment.cleanup()
    marks = walk.timeline.marks
    extra = {
        "fresh_cache": fresh,
        "busy_loops": len(hogs),
        "cores": os.cpu_count(),
        "drafter_change_s": walk.drafter_changes_s,
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
