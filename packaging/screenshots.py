"""Screenshots of the main window, light and dark, with a real reply from the built-in pair.

packaging/walkthrough.sh takes the same three pictures as part of a full walk through the app; this
script takes only them. Run through packaging/screenshots.sh, which starts a real X server (Xvfb) and a window manager. The
window is populated the way a user would see it: a few earlier conversations in the sidebar, then one
prompt answered live by the built-in models with token colouring on.

    python packaging/screenshots.py [OUT_DIR]   # default: packaging/screenshots
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.config import AppConfig  # noqa: E402
from app.main_window import MainWindow  # noqa: E402
from app.qt import QObject, QTimer, QtWidgets, Slot  # noqa: E402
from engine.store.database import Store  # noqa: E402

PROMPT = "Write a Python function that checks whether a number is prime, with a short explanation."
EARLIER = [
    ("Packing list for a weekend hike", "What should I pack for a two-day hike?"),
    (
        "Explain speculative decoding",
        "How can a small model make a big one faster without changing its output?",
    ),
    ("SQL: latest order per customer", "Write a query for each customer's latest order."),
]
TIMEOUT_S = 600


class Shooter(QObject):
    def __init__(self, app, window: MainWindow, out_dir: Path):
        super().__init__(window)
        self.app, self.window, self.out_dir = app, window, out_dir
        self.failure: str | None = None
        window.models_loaded.connect(self.on_loaded)
        window.reply_finished.connect(self.on_finished)
        QTimer.singleShot(TIMEOUT_S * 1000, self, self.on_timeout)

    @Slot(object)
    def on_loaded(self, _info) -> None:
        self.window.message_edit.setPlainText(PROMPT)
        self.window.send()

    @Slot(str)
    def on_finished(self, status: str) -> None:
        if status != "complete":
            self.failure = f"the reply ended as {status}"
        QTimer.singleShot(500, self, self.shoot)

    @Slot()
    def on_timeout(self) -> None:
        self.failure = "no reply in time"
        self.app.quit()

    @Slot()
    def shoot(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        shots = (("light", "light", True), ("dark", "dark", True), ("formatted-dark", "dark", False))
        for name, mode, coloured in shots:
            self.window.set_appearance(mode, save=False)
            self.window.chat_view.set_coloured(coloured)
            for _ in range(5):
                self.app.processEvents()
            path = self.out_dir / f"main-window-{name}.png"
            self.window.grab().save(str(path))
            print(f"wrote {path}", flush=True)
        self.window.close()
        self.app.quit()


def main(out_dir: Path) -> int:
    app = QtWidgets.QApplication(sys.argv[:1])
    app.setStyle("Fusion")
    with tempfile.TemporaryDirectory(prefix="tandem-screenshots-") as folder:
        store = Store(Path(folder) / "screens.db")
        for title, question in EARLIER:
            conversation = store.create_conversation(title)
            store.add_message(conversation, "user", question)
        store.set_setting("main_window", {"colour_tokens": True})
        window = MainWindow(store, AppConfig(max_new_tokens=200))
        window.resize(1400, 880)
        window.new_conversation()
        window.show()
        shooter = Shooter(app, window, out_dir)
        window.load_models()
        app.exec()
        store.close()
    if shooter.failure:
        print(f"screenshots failed: {shooter.failure}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "packaging" / "screenshots"))
