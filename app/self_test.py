"""`tandem --self-test`: the real window, a temporary database, one prompt to the built-in pair.

Passes when tokens streamed into the chat, the stats panel showed numbers, and the conversation was
stored complete with its stats. Prints the reason and exits non-zero otherwise.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from app.qt import QObject, QTimer, QtWidgets, Slot

PROMPT = "Write a short Python function that returns the square of a number."
TIMEOUT_S = float(os.environ.get("TANDEM_SELF_TEST_TIMEOUT", "600"))
MAX_NEW_TOKENS = 96


class SelfTest(QObject):
    def __init__(self, window, screenshot: Path | None, timeout_s: float):
        super().__init__(window)
        self.window = window
        self.screenshot = screenshot
        self.failure: str | None = "did not finish"
        self.pieces = 0
        self.started = time.monotonic()
        window.models_loaded.connect(self.on_loaded)
        window.bridge.load_failed.connect(self.on_load_failed)
        window.bridge.worker.piece.connect(self.on_piece)
        window.reply_finished.connect(self.on_reply_finished)
        QTimer.singleShot(int(timeout_s * 1000), self, self.on_timeout)

    @Slot(object)
    def on_loaded(self, info) -> None:
        print(f"self-test: models loaded in {time.monotonic() - self.started:.1f} s: {info}", flush=True)
        print(f"self-test: {cpu_kernels_status()}", flush=True)
        self.window.message_edit.setPlainText(PROMPT)
        self.window.send()

    @Slot(str, str)
    def on_load_failed(self, message: str, details: str) -> None:
        self.finish(f"loading the models failed: {message}\n{details}")

    @Slot(object)
    def on_piece(self, _piece) -> None:
        self.pieces += 1

    @Slot(str)
    def on_reply_finished(self, status: str) -> None:
        self.finish(self.check(status))

    @Slot()
    def on_timeout(self) -> None:
        self.finish(f"no complete reply within the time limit ({self.pieces} pieces streamed)")

    def check(self, status: str) -> str | None:
        window = self.window
        if status != "complete":
            return f"the reply ended as {status}"
        if self.pieces == 0:
            return "no tokens were streamed"
        if not window.stats_panel.value_text("tokens_per_s").endswith("tok/s"):
            return "the stats panel shows no speed"
        conversations = window.store.list_conversations()
        if len(conversations) != 1:
            return f"expected one stored conversation, found {len(conversations)}"
        thread = window.store.thread(conversations[0].id)
        roles = [m.role for m in thread]
        if roles != ["user", "assistant"]:
            return f"stored thread has roles {roles}"
        reply = thread[-1]
        if reply.status != "complete" or not reply.content.strip():
            return f"stored reply is {reply.status!r} with {len(reply.content)} characters"
        if not (reply.stats or {}).get("generated_tokens"):
            return "stored reply has no generation stats"
        print(
            f"self-test: {reply.stats['generated_tokens']} tokens in {self.pieces} pieces; "
            f"stats: {window.stats_panel.value_text('tokens_per_s')}, acceptance "
            f"{window.stats_panel.value_text('acceptance')}",
            flush=True,
        )
        return None

    def finish(self, failure: str | None) -> None:
        if self.failure != "did not finish":
            return
        self.failure = failure
        if self.screenshot is not None:
            self.screenshot.parent.mkdir(parents=True, exist_ok=True)
            if not self.window.grab().save(str(self.screenshot)):
                self.failure = self.failure or f"could not save a screenshot to {self.screenshot}"
        self.window.close()
        QtWidgets.QApplication.instance().quit()


def cpu_kernels_status() -> str:
    """Whether Tandem's own CPU kernels loaded (the installed bundle ships them prebuilt)."""
    from engine.kernels import native_ops

    error = native_ops.build_error()  # cached: loading the models asked already
    return "CPU kernels: loaded" if error is None else f"CPU kernels: unavailable ({error})"


def run_self_test(screenshot: Path | None = None, timeout_s: float = TIMEOUT_S) -> int:
    from app.config import AppConfig
    from app.main_window import MainWindow
    from engine.store.database import Store

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    with tempfile.TemporaryDirectory(prefix="tandem-self-test-") as folder:
        store = Store(Path(folder) / "self-test.db")
        config = AppConfig(max_new_tokens=MAX_NEW_TOKENS)
        window = MainWindow(store, config)
        test = SelfTest(window, screenshot, timeout_s)
        window.show()
        window.load_models()
        app.exec()
        store.close()
    if test.failure:
        print(f"self-test FAILED: {test.failure}")
        return 1
    print("self-test passed")
    return 0
