"""The model manager: installed models with size and location, will-it-fit per suggested pair, a download
that fails offline with a clear message, cancel, remove with confirmation, the hub token kept outside the DB."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from app.model_manager import ModelManager
from app.qt import QTimer, QtWidgets
from engine.models import manage
from engine.models.builtin import COMPLETE_MARKER

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


def test_installed_models_show_size_and_location(manager):
    """The built-in model runs from its GGUF file as it is: the file is where it lives, and its size."""
    from engine.models.builtin import DEFAULT_TARGET, builtin_entry, builtin_gguf_path

    rows = table_rows(manager.installed_table)
    builtin = next(row for row in rows if row[3] == "builtin")
    path = builtin_gguf_path(builtin_entry(DEFAULT_TARGET))
    assert builtin[2] == str(path)
    assert builtin[1] == f"{path.stat().st_size / 1024**3:.2f} GiB"


def test_the_cpu_pairs_say_their_fit_and_what_the_draft_costs(qtbot, manager):
    qtbot.waitUntil(
        lambda: all(row[2] != "Estimating…" for row in table_rows(manager.pairs_table)), timeout=TIMEOUT_MS
    )
    rows = {
        pair.target: row for pair, row in zip(manager._pairs, table_rows(manager.pairs_table), strict=True)
    }
    smol = rows["bartowski/SmolLM2-1.7B-Instruct-GGUF:Q4_K_M"]
    assert "builtin:smollm2-135m-instruct" in smol[0]  # the built-in model drafts for it
    assert "8,192 tokens of context" in smol[1] and smol[1].endswith(("fits.", "tight.", "won't fit."))
    assert "of a target step" in smol[2]
    assert "EAGLE3" in rows["bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q4_K_M"][0]
    builtin = rows["builtin:smollm2-135m-instruct"]
    assert "INT8" not in builtin[0] and "Q4_1" in builtin[0]


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


def test_a_hub_repository_lists_its_gguf_files_and_downloads_one(qtbot, tmp_path, monkeypatch):
    """Against a local server that answers as the hub does: list, download with progress, use as draft."""
    from huggingface_hub import constants

    from engine.models.builtin import DEFAULT_TARGET, builtin_entry, builtin_gguf_path
    from tests.fake_hub import FakeHub

    data = builtin_gguf_path(builtin_entry(DEFAULT_TARGET)).read_bytes()
    hub = FakeHub()
    hub.add("acme/Smol-GGUF", {"Smol-Q4_1.gguf": data, "Smol-Q8_0.gguf": data[: 1024 * 1024]})
    hub.start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path / "tandem"))
    dialog = ModelManager()
    qtbot.addWidget(dialog)
    try:
        dialog.hub_repo_edit.setText("acme/nothing-here")
        with qtbot.waitSignal(dialog.hub_listed, timeout=TIMEOUT_MS) as listed:
            dialog.hub_list_button.click()
        assert "no 'acme/nothing-here'" in listed.args[0]

        dialog.hub_repo_edit.setText("acme/Smol-GGUF")
        with qtbot.waitSignal(dialog.hub_listed, timeout=TIMEOUT_MS) as listed:
            dialog.hub_list_button.click()
        assert listed.args[0] == ""
        rows = table_rows(dialog.hub_table)
        assert [row[0] for row in rows] == ["Q8_0", "Q4_1"]
        assert rows[1][1] == f"{len(data) / 1024**3:.2f} GiB" and rows[1][3] in ("fits", "tight", "won't fit")
        needs_at_8k = rows[1][2]
        dialog.hub_context.setValue(131072)  # a longer context needs a larger KV cache
        qtbot.waitUntil(lambda: table_rows(dialog.hub_table)[1][2] != needs_at_8k, timeout=TIMEOUT_MS)

        dialog.hub_table.selectRow(1)
        progress: list[tuple[int, int]] = []
        dialog._relay.progress.connect(lambda _stage, done, total: progress.append((done, total)))
        with qtbot.waitSignal(dialog.download_finished, timeout=TIMEOUT_MS) as finished:
            dialog.hub_download_button.click()
            assert dialog.cancel_button.isEnabled()  # the GUI thread did not wait for the download
        assert finished.args[0] == "done", finished.args
        assert (len(data), len(data)) in progress
        assert dialog.use_draft_button.isEnabled()
        with qtbot.waitSignal(dialog.model_chosen) as chosen:
            dialog.use_draft_button.click()
        assert chosen.args[0] == "draft" and chosen.args[1].endswith("Smol-Q4_1.gguf")
        assert Path(chosen.args[1]).read_bytes() == data
        qtbot.waitUntil(
            lambda: any(row[3] == "hub-gguf" for row in table_rows(dialog.installed_table)),
            timeout=TIMEOUT_MS,
        )

        hub.corrupt.add(("acme/Smol-GGUF", "Smol-Q8_0.gguf"))
        dialog.hub_table.selectRow(0)
        with qtbot.waitSignal(dialog.download_finished, timeout=TIMEOUT_MS) as finished:
            dialog.hub_download_button.click()
        assert "damaged" in finished.args[0] and "damaged" in dialog.status_label.text()
    finally:
        dialog.done(0)
        hub.stop()


def test_the_hub_files_fit_at_the_context_chosen_in_settings(qtbot, store, tmp_path, monkeypatch):
    """Opened from the window, the manager judges each hub file at the app's context, and follows a
    context chosen anew while it is open."""
    from huggingface_hub import constants

    from app.config import AppConfig
    from app.main_window import MainWindow
    from engine.models import gguf_hub
    from engine.models.builtin import DEFAULT_TARGET, builtin_entry, builtin_gguf_path
    from tests.fake_hub import FakeHub
    from tests.test_app import ScriptedEngine, factory_for

    data = builtin_gguf_path(builtin_entry(DEFAULT_TARGET)).read_bytes()
    hub = FakeHub()
    hub.add("acme/Smol-GGUF", {"Smol-Q4_1.gguf": data})
    hub.start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    config = AppConfig(context=65536, auto_titles=False)
    window = MainWindow(store, config, engine_factory=factory_for(ScriptedEngine(["ok"])))
    qtbot.addWidget(window)
    try:
        window.models_action.trigger()
        dialog = window.findChild(ModelManager)
        assert dialog.hub_context.value() == 65536
        dialog.hub_repo_edit.setText("acme/Smol-GGUF")
        with qtbot.waitSignal(dialog.hub_listed, timeout=TIMEOUT_MS) as listed:
            dialog.hub_list_button.click()
        assert listed.args[0] == "" and dialog._hub_kv  # the file's KV cache per token is known

        def needs(context: int) -> str:
            return f"{gguf_hub.file_fit(len(data), dialog._hub_kv, context).total_bytes / 1024**3:.2f} GiB"

        assert needs(65536) != needs(4096)
        assert table_rows(dialog.hub_table)[0][2] == needs(65536)
        window.apply_config(AppConfig(context=4096, auto_titles=False))
        assert dialog.hub_context.value() == 4096
        qtbot.waitUntil(lambda: table_rows(dialog.hub_table)[0][2] == needs(4096), timeout=TIMEOUT_MS)
        dialog.hub_context.setValue(2048)  # judged here at another context, until one is chosen anew
        window.apply_config(AppConfig(context=4096, temperature=0.5, auto_titles=False))
        assert dialog.hub_context.value() == 2048
        dialog.done(0)
    finally:
        window.close()
        hub.stop()
