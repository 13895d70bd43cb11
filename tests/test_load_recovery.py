"""A failed load keeps the working pair, the error dialog offers the built-in model, a bad saved config
does not break the next start, and a second app on the same database is told it is in use."""

from __future__ import annotations

import pytest

from app.config import AppConfig
from app.load_recovery import USE_BUILTIN, start_check
from app.main_window import MainWindow
from engine.errors import ModelNotFoundError
from engine.models.builtin import DEFAULT_TARGET

LOAD_TIMEOUT_MS = 180_000
# the offscreen platform's note when a dialog shows
pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


def open_window(qtbot, store, config: AppConfig) -> MainWindow:
    window = MainWindow(store, config)
    qtbot.addWidget(window)
    return window


def wait_for_failure(qtbot, window):
    # (the worker's own signal would be caught on the worker's thread; the window's label is not)
    qtbot.waitUntil(
        lambda: window.activity_label.text().startswith("Loading failed"), timeout=LOAD_TIMEOUT_MS
    )


def test_a_failed_load_keeps_the_working_pair_answering(qtbot, store, tmp_path):
    working = AppConfig(drafter="ngram", max_new_tokens=4)
    working.save(store)
    window = open_window(qtbot, store, working)
    with qtbot.waitSignal(window.models_loaded, timeout=LOAD_TIMEOUT_MS):
        window.load_models()
    loaded_label = window.models_label.text()

    broken = AppConfig(drafter="ngram", max_new_tokens=4, target=str(tmp_path / "deleted-model"))
    window.apply_config(broken)
    wait_for_failure(qtbot, window)
    assert window.models_label.text() == loaded_label
    assert "No model loaded" not in window.models_label.text()
    assert "still using" in window.activity_label.text()
    assert AppConfig.load(store) == working  # the next start loads what works
    assert window.config == working
    assert "keeps using" in window.load_error_box.text()
    window.load_error_box.done(0)

    window.message_edit.setPlainText("Hello")  # and the old models still answer
    with qtbot.waitSignal(window.reply_finished, timeout=LOAD_TIMEOUT_MS) as finished:
        window.send()
    assert finished.args[0] == "complete"


def test_the_load_error_dialog_offers_the_builtin_model(qtbot, store, tmp_path):
    window = open_window(qtbot, store, AppConfig(drafter="ngram", target=str(tmp_path / "gone")))
    window.load_models()
    wait_for_failure(qtbot, window)
    assert window.models_label.text() == "No model loaded"
    box = window.load_error_box
    builtin = next(b for b in box.buttons() if b.text() == USE_BUILTIN)
    with qtbot.waitSignal(window.models_loaded, timeout=LOAD_TIMEOUT_MS) as loaded:
        builtin.click()
    assert not box.isVisible()
    assert loaded.args[0].target == DEFAULT_TARGET.removeprefix("builtin:")
    assert window.config.target == DEFAULT_TARGET
    assert AppConfig.load_working(store).target == DEFAULT_TARGET


def test_a_saved_target_that_is_gone_is_caught_at_start(tmp_path):
    with pytest.raises(ModelNotFoundError, match="No model at"):
        start_check(AppConfig(target=str(tmp_path / "gone")))
    start_check(AppConfig())  # the built-in pair
    start_check(AppConfig(backend="server", server_url="http://127.0.0.1:1/v1", target="whatever"))


def test_a_second_app_on_the_same_database_is_told_it_is_in_use(qtbot, tmp_path, capsys):
    from app.main import open_store
    from app.qt import QTimer, QtWidgets
    from engine.store.database import Store

    path = tmp_path / "tandem.db"
    first = open_store(path)
    assert first is not None
    seen: list[str] = []

    def answer_the_message():
        box = QtWidgets.QApplication.activeModalWidget()
        if box is None:
            QTimer.singleShot(50, answer_the_message)
            return
        seen.append(box.text())
        box.accept()

    QTimer.singleShot(50, answer_the_message)
    try:
        assert open_store(path) is None
    finally:
        first.close()
    assert seen and "in use by another Tandem" in seen[0]
    assert "in use" in capsys.readouterr().err
    with Store(path) as again:  # once the first has closed, the database is free
        again.acquire_instance_lock()
