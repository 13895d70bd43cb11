"""Walk through the app as a new user does, on a real X server, saving a screenshot after each step.

First start, send, stop, regenerate, edit, search, export, import, settings with a bad path, restart.
Input goes through Qt's test events (key presses and mouse clicks on the real widgets), the models are
the built-in pair, and the database is a fresh one in a temporary folder. Each step waits for what a
user would wait for (the reply, the search results), then saves packaging/screenshots/walkthrough-*.png.
The README's main-window-light.png / -dark.png / -formatted-dark.png come from the same run.

    packaging/walkthrough.sh [OUT_DIR]      # starts Xvfb + openbox and runs this
    python packaging/walkthrough.py OUT_DIR # on a display you already have

Exit status 0 when every step did what it should; otherwise the failing step is printed.
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

from PySide6.QtTest import QTest  # noqa: E402

from app.config import AppConfig  # noqa: E402
from app.main_window import MainWindow  # noqa: E402
from app.qt import QObject, Qt, QtCore, QtGui, QTimer, QtWidgets  # noqa: E402
from engine.store.database import Store  # noqa: E402

FIRST_PROMPT = "Write a Python function that checks whether a number is prime, with a short explanation."
LONG_PROMPT = "Tell me a long story about a lighthouse keeper and a storm."
EDITED_PROMPT = "Write a short Python function that checks whether a number is even."
STEP_TIMEOUT_S = 900  # a reply on a busy 2-core machine can take minutes
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
        self.steps: list[tuple[str, Step]] = [
            ("first start", self.first_start),
            ("shot: first start", lambda: self.shoot("01-first-start")),
            ("send", self.send_first),
            ("shot: reply", lambda: self.shoot("02-reply")),
            ("readme shots", self.readme_shots),
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
            ("import", self.import_by_drop),
            ("shot: imported", lambda: self.shoot("10-imported")),
            ("quit mid-reply", self.send_long),
            ("press Alt+F4", self.close_by_window_manager),
            ("shot: quit question", self.shoot_screen_area),
            ("keep writing", self.keep_writing),
            ("settings with a bad path", self.bad_settings),
            ("shot: settings refused", self.shoot_settings),
            ("cancel settings", self.cancel_settings),
            ("restart", self.restart),
            ("shot: after restart", lambda: self.shoot("12-restart")),
            ("dark", self.dark),
            ("shot: dark", lambda: self.shoot("13-dark")),
            ("finish", self.finish),
        ]
        self.index = -1
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
        try:
            self.waiting = step()
        except Exception as exc:  # noqa: BLE001 - a walkthrough reports, then stops
            self.fail(f"{name}: {type(exc).__name__}: {exc}")

    def tick(self) -> None:
        if self.failure is not None:
            return
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
        self.loaded = False
        window.models_loaded.connect(lambda _info: setattr(self, "loaded", True))
        return window

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
        self.window = self.open_window()
        self.window.load_models()
        return lambda: self.loaded and self.window.reply is None

    def send_first(self):
        self.type_and_send(FIRST_PROMPT)
        return self.reply_done(1)

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
        QTest.keyClick(self.window, Qt.Key.Key_Escape)
        return lambda: len(self.finished) >= 2 and self.finished[-1] == "cancelled"

    def regenerate(self):
        widget = self.window.chat_view.widgets[-1]
        self.click(widget.action_button)  # "Regenerate" on the stopped reply
        return lambda: len(self.finished) >= 3

    def edit_first(self):
        first_user = next(w for w in self.window.chat_view.widgets if w.message.role == "user")
        self.click(first_user.action_button)  # "Edit"
        edit = self.window.message_edit
        edit.selectAll()
        QTest.keyClick(edit, Qt.Key.Key_Delete)
        self.type_and_send(EDITED_PROMPT)
        return lambda: len(self.finished) >= 4

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
        self.window = self.open_window()
        self.window.load_models()
        return lambda: self.loaded or "failed" in self.window.activity_label.text()

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


def main(out_dir: Path) -> int:
    app = QtWidgets.QApplication(sys.argv[:1])
    app.setStyle("Fusion")
    app.setQuitOnLastWindowClosed(False)  # the restart step closes the only window before opening the next
    with tempfile.TemporaryDirectory(prefix="tandem-walkthrough-") as folder:
        work = Path(folder)
        walk = Walkthrough(app, work / "walkthrough.db", out_dir, work)
        QTimer.singleShot(0, walk.start)
        app.exec()
        walk.store.close()
    for line in walk.log:
        print(line)
    if walk.failure:
        return 1
    if walk.index < len(walk.steps):
        print(f"walkthrough FAILED: it stopped at step {walk.index + 1} of {len(walk.steps)}")
        return 1
    print("walkthrough passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "packaging" / "screenshots"))
