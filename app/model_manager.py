"""The model manager: installed models (size, location, remove), suggested pairs (will it fit, download
with progress and cancel), and the Hugging Face token for gated models.

Listing, estimates and downloads run on probe threads (app/bridge.py `Probes`): one for look-ups and
one for downloads, so the lists still answer while a download runs. The engine side is
engine/models/manage.py.
"""

from __future__ import annotations

import threading

from app.bridge import Probes
from app.qt import QObject, Qt, QtWidgets, Signal, Slot
from engine.errors import TandemError
from engine.models import manage, probes

GIB = 1024**3


class _Relay(QObject):
    """Lives on the GUI thread; the download thread emits through it, so progress arrives queued."""

    progress = Signal(str, int, int)


class ModelManager(QtWidgets.QDialog):
    download_finished = Signal(str)  # "done", "cancelled" or the error message
    listed = Signal()

    def __init__(self, parent: QtWidgets.QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(980, 600)
        self._lookups = Probes(self)
        self._downloads = Probes(self)
        self._lookups.answered.connect(self._on_lookup)
        self._downloads.answered.connect(self._on_download_done)
        self._relay = _Relay(self)
        self._relay.progress.connect(self._on_progress)
        self._cancel = threading.Event()
        self._installed: list[manage.InstalledModel] = []
        self._pairs = manage.suggested_pairs()

        self.installed_table = _table(["Model", "Size on disk", "Location", "Kind"])
        self.remove_button = QtWidgets.QPushButton("Remove…")
        self.remove_button.setToolTip("Delete a downloaded or converted model from Tandem's cache")
        self.remove_button.clicked.connect(self.remove_selected)
        self.pairs_table = _table(["Suggested pair", "Will it fit here"])
        for row, pair in enumerate(self._pairs):
            self.pairs_table.insertRow(row)
            self.pairs_table.setItem(row, 0, _item(pair.label))
            self.pairs_table.setItem(row, 1, _item("Estimating…"))
        self.download_button = QtWidgets.QPushButton("Download")
        self.download_button.setToolTip("Download the selected pair from the Hugging Face hub")
        self.cancel_button = QtWidgets.QPushButton("Cancel download")
        self.cancel_button.setEnabled(False)
        self.download_button.clicked.connect(self.download_selected)
        self.cancel_button.clicked.connect(self.cancel_download)
        self.progress_bar = QtWidgets.QProgressBar()
        self.progress_bar.setVisible(False)
        self.status_label = QtWidgets.QLabel("")
        self.status_label.setWordWrap(True)
        self.token_edit = QtWidgets.QLineEdit()
        self.token_edit.setEchoMode(QtWidgets.QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("hf_… (for gated models such as Llama)")
        self.token_edit.setToolTip(
            "Kept where huggingface_hub keeps it (readable by you only), never in Tandem's database"
        )
        self.save_token_button = QtWidgets.QPushButton("Save token")
        self.forget_token_button = QtWidgets.QPushButton("Forget token")
        self.save_token_button.clicked.connect(self.save_token)
        self.forget_token_button.clicked.connect(self.forget_token)
        self.token_label = QtWidgets.QLabel("")
        self.token_label.setWordWrap(True)
        self._lay_out()
        self._show_token_state()
        self.refresh()
        for row, pair in enumerate(self._pairs):
            self._lookups.submit(f"fit:{row}", lambda pair=pair: pair_fit(pair))

    def _lay_out(self) -> None:
        layout = QtWidgets.QVBoxLayout(self)
        layout.addWidget(QtWidgets.QLabel("<b>Installed</b>"))
        layout.addWidget(self.installed_table, 1)
        layout.addWidget(self.remove_button, 0, Qt.AlignmentFlag.AlignRight)
        layout.addWidget(QtWidgets.QLabel("<b>Suggested pairs</b> (target + draft)"))
        layout.addWidget(self.pairs_table, 1)
        row = QtWidgets.QHBoxLayout()
        row.addWidget(self.progress_bar, 1)
        row.addWidget(self.download_button)
        row.addWidget(self.cancel_button)
        layout.addLayout(row)
        layout.addWidget(self.status_label)
        token = QtWidgets.QHBoxLayout()
        token.addWidget(QtWidgets.QLabel("Hugging Face token:"))
        token.addWidget(self.token_edit, 1)
        token.addWidget(self.save_token_button)
        token.addWidget(self.forget_token_button)
        layout.addLayout(token)
        layout.addWidget(self.token_label)
        close = QtWidgets.QDialogButtonBox(QtWidgets.QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        layout.addWidget(close)

    # --- installed -------------------------------------------------------------------------------

    def refresh(self) -> None:
        self._lookups.submit("installed", manage.installed_models)

    def select_installed(self, spec: str) -> None:
        for row, model in enumerate(self._installed):
            if model.spec == spec:
                self.installed_table.selectRow(row)

    @Slot()
    def remove_selected(self) -> None:
        row = self.installed_table.currentRow()
        if not 0 <= row < len(self._installed):
            return
        model = self._installed[row]
        answer = QtWidgets.QMessageBox.question(
            self, "Remove model", f"Delete {model.name} ({_size(model.size_bytes)}) from {model.folder}?"
        )
        if answer != QtWidgets.QMessageBox.StandardButton.Yes:
            return
        try:
            manage.remove_model(model)
        except (TandemError, OSError) as error:
            self.status_label.setText(str(error))
            return
        self.status_label.setText(f"Removed {model.name}.")
        self.refresh()

    # --- downloads -------------------------------------------------------------------------------

    @Slot()
    def download_selected(self) -> None:
        row = self.pairs_table.currentRow()
        if not 0 <= row < len(self._pairs):
            self.status_label.setText("Choose a pair to download.")
            return
        pair, relay, cancel = self._pairs[row], self._relay, threading.Event()
        self._cancel = cancel
        self.destroyed.connect(lambda *_: cancel.set())  # a closed manager stops its download
        self.download_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress_bar.setVisible(True)
        self.progress_bar.setRange(0, 0)
        self.status_label.setText(f"Downloading {pair.label}…")
        self._downloads.submit("download", lambda: manage.download_pair(pair, relay.progress.emit, cancel))

    @Slot()
    def cancel_download(self) -> None:
        self._cancel.set()
        self.status_label.setText("Cancelling…")

    @Slot(str, int, int)
    def _on_progress(self, stage: str, done: int, total: int) -> None:
        self.progress_bar.setRange(0, max(total, 0))
        self.progress_bar.setValue(min(done, total) if total > 0 else 0)
        self.status_label.setText(stage + "…")

    @Slot(str, int, object, object)
    def _on_download_done(self, _kind: str, _token: int, _result, error) -> None:
        self.download_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.progress_bar.setVisible(False)
        if isinstance(error, manage.DownloadCancelled):
            outcome = "cancelled"
            self.status_label.setText(str(error))
        elif error is not None:
            outcome = str(error) if isinstance(error, TandemError) else f"Download failed: {error}"
            self.status_label.setText(outcome)
        else:
            outcome = "done"
            self.status_label.setText("Downloaded. Choose the pair in Settings (Ctrl+,).")
            self.refresh()
        self.download_finished.emit(outcome)

    # --- look-ups --------------------------------------------------------------------------------

    @Slot(str, int, object, object)
    def _on_lookup(self, kind: str, _token: int, result, error) -> None:
        if kind == "installed":
            self._installed = [] if error else result
            self.installed_table.setRowCount(0)
            for row, model in enumerate(self._installed):
                self.installed_table.insertRow(row)
                for column, text in enumerate(
                    (
                        model.name,
                        _size(model.size_bytes),
                        str(model.folder or "not converted yet"),
                        model.source,
                    )
                ):
                    self.installed_table.setItem(row, column, _item(text))
            if error:
                self.status_label.setText(f"Could not list the models: {error}")
            self.listed.emit()
        elif kind.startswith("fit:"):
            row = int(kind.partition(":")[2])
            self.pairs_table.setItem(row, 1, _item(f"Could not estimate: {error}" if error else result))

    # --- token -----------------------------------------------------------------------------------

    @Slot()
    def save_token(self) -> None:
        try:
            path = manage.save_hf_token(self.token_edit.text())
        except (TandemError, OSError) as error:
            self.token_label.setText(str(error))
            return
        self.token_edit.clear()
        self.token_label.setText(f"Token saved in {path} (readable by you only).")

    @Slot()
    def forget_token(self) -> None:
        manage.forget_hf_token()
        self._show_token_state()

    def _show_token_state(self) -> None:
        where = manage.token_path()
        self.token_label.setText(
            f"A token is saved in {where}."
            if manage.has_hf_token()
            else "No token saved (public models need none)."
        )

    def done(self, result: int) -> None:
        self._cancel.set()
        for runner in (self._lookups, self._downloads):
            runner.shutdown(timeout_ms=-1)
        super().done(result)


def _table(headers: list[str]) -> QtWidgets.QTableWidget:
    """A read-only table whose columns are as wide as their text: names and paths are never cut short
    (a horizontal scroll bar appears where the window is narrower than them)."""
    table = QtWidgets.QTableWidget(0, len(headers))
    table.setHorizontalHeaderLabels(headers)
    table.setSelectionBehavior(QtWidgets.QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QtWidgets.QAbstractItemView.SelectionMode.SingleSelection)
    table.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setTextElideMode(Qt.TextElideMode.ElideNone)
    table.setWordWrap(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QtWidgets.QHeaderView.ResizeMode.ResizeToContents)
    header.setStretchLastSection(False)
    table.verticalHeader().setVisible(False)
    return table


def pair_fit(pair: manage.SuggestedPair) -> str:
    """Will the pair fit here: for a pair on disk the very line Settings shows for it (one function,
    engine.models.probes.memory_line, at the pair's draft quantization); else the catalogue's estimate."""
    from engine.models import catalog
    from engine.models.loaded import resolve_device

    on_disk = {entry.spec for entry in catalog.list_models(include_catalogue=False) if entry.folder}
    if not {pair.target, pair.draft} <= on_disk:  # never converts or downloads to answer
        return manage.pair_fit(pair)
    try:
        line = probes.memory_line(pair.target, pair.draft, draft_quantization=pair.draft_quantization)
    except TandemError:
        return manage.pair_fit(pair)
    if pair.device == "cuda" and resolve_device("auto").type != "cuda":
        line += " Suggested for a GPU; this machine has none."
    return line


def _item(text: str) -> QtWidgets.QTableWidgetItem:
    item = QtWidgets.QTableWidgetItem(text)
    item.setToolTip(text)
    return item


def _size(size_bytes: int | None) -> str:
    return "?" if size_bytes is None else f"{size_bytes / GIB:.2f} GiB"


def open_model_manager(window) -> ModelManager:
    """Chat ▸ Models…: the manager, non-modal, deleted when closed."""
    dialog = ModelManager(window)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.open()
    return dialog
