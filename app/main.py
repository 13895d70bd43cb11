"""`tandem`: the desktop app's entry point."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

NO_DISPLAY_MESSAGE = (
    "tandem: no display found (DISPLAY and WAYLAND_DISPLAY are unset).\n"
    "Chat in the terminal instead with:  tandem-cli chat\n"
    "or run the window without a screen with QT_QPA_PLATFORM=offscreen."
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tandem", description="Chat with local language models, faster.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--db", type=Path, help="conversation database (default: in the data folder)")
    parser.add_argument("--reset-settings", action="store_true", help="forget settings and window layout")
    parser.add_argument(
        "--self-test", action="store_true", help="send one prompt to the built-in models and check the reply"
    )
    parser.add_argument(
        "--screenshot",
        type=Path,
        metavar="PATH",
        help="save a PNG of the window (with --self-test: after the reply)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --self-test: how long to wait for the models and the reply (default 600)",
    )
    return parser.parse_args(argv)


def display_missing() -> bool:
    if os.environ.get("QT_QPA_PLATFORM") or not sys.platform.startswith("linux"):
        return False
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.version:
        from engine import __version__

        print(__version__)
        return 0
    if display_missing():
        print(NO_DISPLAY_MESSAGE, file=sys.stderr)
        return 2
    from app import platform_check

    missing = platform_check.problem() if platform_check.uses_xcb() else None
    if missing:  # before Qt aborts with a message that names another library
        print(missing, file=sys.stderr)
        return 2
    if args.self_test:
        from app.self_test import run_self_test

        if args.timeout is not None:
            return run_self_test(args.screenshot, args.timeout)
        return run_self_test(args.screenshot)
    return run_app(args)


def run_app(args: argparse.Namespace) -> int:
    from app import crash
    from app.qt import QtWidgets
    from engine.paths import data_dir

    log_dir = data_dir()
    report = crash.take_report(log_dir)
    crash.install(log_dir)
    app = QtWidgets.QApplication(sys.argv[:1])
    app.setApplicationName("Tandem")
    store = open_store(args.db)
    if store is None:
        return 1
    if args.reset_settings:
        from app.config import STORE_KEY, WORKING_KEY
        from app.main_window import WINDOW_KEY

        for key in (STORE_KEY, WORKING_KEY, WINDOW_KEY):
            store.set_setting(key, None)

    from app.config import AppConfig
    from app.load_recovery import start_check
    from app.main_window import MainWindow

    # A saved config whose models are gone starts on the last one that loaded, and says so.
    config, fallback_message = AppConfig.load_for_start(store, start_check)
    window = MainWindow(store, config)
    window.show()
    if report:  # painted before the load starts, which holds the interpreter for long stretches
        show_crash_notice(window, report, log_dir)
    window.load_models()  # in the background: the window takes a message at once
    if fallback_message:  # said without a modal box, so nothing stands before the first message
        window.statusBar().showMessage(fallback_message.replace("\n\n", " "), 60000)
        window.models_label.setToolTip(fallback_message)
    if args.screenshot:
        window.models_loaded.connect(lambda _info: (window.grab().save(str(args.screenshot)), window.close()))
    code = app.exec()
    store.close()
    return code


def show_crash_notice(window, report: str, log_dir: Path):
    """The "closed unexpectedly" notice, shown and painted now. Shown after the load had started, it
    stayed black for the whole load: the loader thread's imports and conversions held the interpreter,
    so its first paint waited for them."""
    import time

    from app.qt import QtCore, QtWidgets

    box = QtWidgets.QMessageBox(
        QtWidgets.QMessageBox.Icon.Warning,
        "Tandem closed unexpectedly",
        f"Tandem closed unexpectedly last time. The report is kept in {log_dir}.",
        parent=window,
    )
    box.setDetailedText(report)
    box.setWindowModality(QtCore.Qt.WindowModality.NonModal)  # the chat stays usable behind it
    box.show()
    deadline = time.monotonic() + 2.0  # the window manager maps it; then it paints
    while time.monotonic() < deadline:
        QtWidgets.QApplication.processEvents(QtCore.QEventLoop.ProcessEventsFlag.AllEvents, 50)
        handle = box.windowHandle()
        if handle is not None and handle.isExposed():
            box.repaint()
            QtWidgets.QApplication.processEvents()
            break
    return box


def open_store(path: Path | None):
    """The store, or None after telling the user why it cannot be opened."""
    from app.qt import QtWidgets
    from engine.errors import CorruptDatabaseError, DatabaseLockedError, StorageError
    from engine.store.database import Store

    try:
        store = Store(path)
    except CorruptDatabaseError as exc:
        answer = QtWidgets.QMessageBox.question(
            None,
            "Tandem",
            f"{exc}\n\nMove it aside and start a fresh database?",
        )
        if answer != QtWidgets.QMessageBox.StandardButton.Yes:
            return None
        Store.move_aside(exc.path)
        store = Store(path)
    except StorageError as exc:
        QtWidgets.QMessageBox.critical(None, "Tandem", str(exc))
        return None
    try:
        store.acquire_instance_lock()  # one app or terminal chat per database
    except DatabaseLockedError as exc:
        store.close()
        print(f"tandem: {exc}", file=sys.stderr)
        QtWidgets.QMessageBox.information(None, "Tandem is already open", str(exc))
        return None
    return store


if __name__ == "__main__":
    sys.exit(main())
