"""The model manager: installed models with size and location, will-it-fit per suggested pair, a download
that fails offline with a clear message, cancel, remove with confirmation, the hub token kept outside the DB."""

from __future__ import annotations

import json
import threading

import pytest

from app.model_manager import ModelManager
from app.qt import QTimer, QtWidgets
from engine.models import manage
from engine.models.builtin import COMPLETE_MARKER, converted_dir

TIMEOUT_MS = 60_000
pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


@pytest.fixture
def manager(qtbot):
    dialog = ModelManager()
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.installed_table.rowCount() > 0, timeout=TIMEOUT_MS)
    yield dialog
    dialog.done(0)


def table_rows(table) -> list[list[str]]:
    return [[table.item(r, c).text() for c in range(table.columnCount())] for r in range(table.rowCount())]


ANSWERED: set[int] = set()


def answer_next_question(button) -> list[str]:
    """Answer the next modal question with `button`, as the user would; returns its text once seen."""
    seen: list[str] = []

    def answer():
        box = QtWidgets.QApplication.activeModalWidget()
        if not isinstance(box, QtWidgets.QMessageBox) or not box.isVisible() or id(box) in ANSWERED:
            QTimer.singleShot(50, answer)
            return
        ANSWERED.add(id(box))
        seen.append(box.text())
        box.button(button).click()

    QTimer.singleShot(50, answer)
    return seen


def test_installed_models_show_size_and_location(manager, builtin_folder):
    rows = table_rows(manager.installed_table)
    builtin = next(row for row in rows if row[3] == "builtin")
    assert builtin[1].endswith("GiB") and builtin[1] != "?"
    assert builtin[2] == str(converted_dir(builtin_folder.name)) or builtin[2] == str(builtin_folder)


def test_every_suggested_pair_says_whether_it_fits(qtbot, manager):
    def estimated():
        return all(row[1] != "Estimating…" for row in table_rows(manager.pairs_table))

    qtbot.waitUntil(estimated, timeout=TIMEOUT_MS)
    rows = table_rows(manager.pairs_table)
    assert len(rows) == len(manage.suggested_pairs()) >= 2
    assert all(any(v in row[1] for v in ("fits", "tight", "won't fit", "unknown")) for row in rows), rows


def test_downloading_offline_says_so(qtbot, manager, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the state of this machine, said outright
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    hub_row = next(i for i, pair in enumerate(manager._pairs) if "/" in pair.target)
    manager.pairs_table.selectRow(hub_row)
    with qtbot.waitSignal(manager.download_finished, timeout=TIMEOUT_MS) as finished:
        manager.download_button.click()
    assert "offline" in finished.args[0].lower()
    assert "offline" in manager.status_label.text().lower()
    assert manager.download_button.isEnabled() and not manager.cancel_button.isEnabled()


def test_a_cancelled_download_stops_at_the_next_progress_report():
    cancel = threading.Event()
    cancel.set()
    pair = next(p for p in manage.suggested_pairs() if "/" in p.target)
    with pytest.raises(manage.DownloadCancelled, match="cancelled"):
        manage.download_pair(pair, cancel=cancel)


def test_removing_a_converted_model_asks_first(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "models" / "gguf" / "tiny-0123456789abcdef"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / COMPLETE_MARKER).write_text(json.dumps({"source": str(tmp_path / "tiny.gguf")}))
    dialog = ModelManager()
    qtbot.addWidget(dialog)
    qtbot.waitUntil(
        lambda: any(r[3] == "gguf-cache" for r in table_rows(dialog.installed_table)), timeout=TIMEOUT_MS
    )
    row = next(i for i, r in enumerate(table_rows(dialog.installed_table)) if r[3] == "gguf-cache")

    dialog.installed_table.selectRow(row)
    asked = answer_next_question(QtWidgets.QMessageBox.StandardButton.No)
    dialog.remove_selected()
    assert asked and "Delete" in asked[0] and folder.is_dir()  # No keeps it

    dialog.installed_table.selectRow(row)
    answer_next_question(QtWidgets.QMessageBox.StandardButton.Yes)
    with qtbot.waitSignal(dialog.listed, timeout=TIMEOUT_MS):
        dialog.remove_selected()
    assert not folder.exists()
    assert all(r[3] != "gguf-cache" for r in table_rows(dialog.installed_table))
    dialog.done(0)


def test_the_builtin_model_and_your_own_folders_are_never_deleted(tmp_path):
    with pytest.raises(Exception, match="built-in"):
        manage.remove_model(manage.InstalledModel("builtin:x", "x", "builtin", 1, tmp_path))
    with pytest.raises(Exception, match="your own folder"):
        manage.remove_model(manage.InstalledModel(str(tmp_path), "x", "local", 1, tmp_path))
    assert tmp_path.is_dir()


def test_the_hub_token_goes_where_huggingface_hub_reads_it(qtbot, tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    dialog = ModelManager()
    qtbot.addWidget(dialog)
    dialog.token_edit.setText("not-a-token")
    dialog.save_token_button.click()
    assert "hf_" in dialog.token_label.text()
    dialog.token_edit.setText("hf_abcdefghijklmnop")
    dialog.save_token_button.click()
    assert huggingface_hub.get_token() == "hf_abcdefghijklmnop"
    assert (tmp_path / "hf" / "token").stat().st_mode & 0o077 == 0
    dialog.forget_token_button.click()
    assert huggingface_hub.get_token() is None
    dialog.done(0)


def test_chat_models_opens_the_manager_from_the_window(qtbot, tmp_path):
    from app.config import AppConfig
    from app.main_window import MainWindow
    from engine.store.database import Store

    with Store(tmp_path / "tandem.db") as store:
        window = MainWindow(store, AppConfig())
        qtbot.addWidget(window)
        window.models_action.trigger()
        dialog = window.findChild(ModelManager)
        assert dialog is not None and dialog.isVisible()
        dialog.done(0)
        window.close()


def test_names_and_paths_are_never_cut_short(qtbot, manager):
    """Every cell is as wide as its text: a model's name and its folder show whole."""
    from app.qt import QtWidgets

    qtbot.waitUntil(
        lambda: all(row[1] != "Estimating…" for row in table_rows(manager.pairs_table)), timeout=TIMEOUT_MS
    )
    for table in (manager.installed_table, manager.pairs_table):
        option = QtWidgets.QStyleOptionViewItem()
        option.initFrom(table)
        for row in range(table.rowCount()):
            for column in range(table.columnCount()):
                index = table.model().index(row, column)
                needed = table.itemDelegate().sizeHint(option, index).width()
                assert table.columnWidth(column) >= needed, (
                    table.item(row, column).text(),
                    table.columnWidth(column),
                )


def test_a_pair_on_disk_gets_the_memory_line_settings_shows(qtbot, manager):
    """One function for both sizes: the manager's line for the built-in pair is Settings' line for it."""
    from engine.models import probes

    pairs = manage.suggested_pairs()
    row = next(i for i, pair in enumerate(pairs) if pair.target.startswith("builtin:"))
    qtbot.waitUntil(lambda: manager.pairs_table.item(row, 1).text() != "Estimating…", timeout=TIMEOUT_MS)
    pair = pairs[row]
    settings_line = probes.memory_line(pair.target, pair.draft, draft_quantization=pair.draft_quantization)
    shown = manager.pairs_table.item(row, 1).text()
    assert shown.split(" (")[0] == settings_line.split(" (")[0]  # the free memory moves between the two
