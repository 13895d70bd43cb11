"""The model manager: installed models (size, location, remove), suggested pairs (will it fit, what the
draft costs, download with progress and cancel), a hub repository's GGUF files (quantization, size,
whether each fits at the context chosen in Settings; download one with progress and cancel, then use it as the
target or the draft), and the Hugging Face token for gated models.

Listing, estimates and downloads run on probe threads (app/bridge.py `Probes`): one for look-ups and
one for downloads, so the lists still answer while a download runs. The engine side is
engine/models/manage.py.
"""

from __future__ import annotations

import threading

from app.bridge import Probes
from app.qt import QObject, Qt, QtWidgets, Signal, Slot
from engine.errors import TandemError
from engine.models import gguf_hub, manage, probes
from engine.settings import DEFAULT_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS, MIN_CONTEXT_TOKENS

GIB = 1024**3


class _Relay(QObject):
    """Lives on the GUI thread; the download thread emits through it, so progress arrives queued."""

    progress = Signal(str, int, int)


class ModelManager(QtWidgets.QDialog):
    download_finished = Signal(str)  # "done", "cancelled" or the error message
    listed = Signal()
    hub_listed = Signal(str)  # "" or the error message
    model_chosen = Signal(str, str)  # role ("target" or "draft"), spec

    def __init__(self, parent: QtWidgets.QWidget | None = None, context: int = DEFAULT_CONTEXT_TOKENS):
        """`context`: the tokens the hub files' fit is judged at to begin with (the app's setting)."""
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
        self._hub_files: list[gguf_hub.HubGGUF] = []
        self._hub_kv: int | None = None
        self._hub_path = ""

        self.installed_table = _table(["Model", "Size on disk", "Location", "Kind"])
        self.remove_button = QtWidgets.QPushButton("Remove…")
        self.remove_button.setToolTip("Delete a downloaded or converted model from Tandem's cache")
        self.remove_button.clicked.connect(self.remove_selected)
        self.pairs_table = _table(["Suggested pair", "Will it fit here", "What the draft costs"])
        for row, pair in enumerate(self._pairs):
            self.pairs_table.insertRow(row)
            self.pairs_table.setItem(row, 0, _item(pair.label))
            self.pairs_table.setItem(row, 1, _item("Estimating…"))
            self.pairs_table.setItem(row, 2, _item("Estimating…"))
        self._chosen_context = context
        self._build_hub_widgets(context)
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
            self._lookups.submit(f"fit:{row}", lambda pair=pair: (pair_fit(pair), manage.draft_cost(pair)))

    def _build_hub_widgets(self, context: int) -> None:
        self.hub_repo_edit = QtWidgets.QLineEdit()
        self.hub_repo_edit.setPlaceholderText(
            "owner/repo of GGUF files, e.g. bartowski/Llama-3.2-1B-Instruct-GGUF"
        )
        self.hub_repo_edit.returnPressed.connect(self.list_hub_files)
        self.hub_context = QtWidgets.QSpinBox()
        self.hub_context.setRange(MIN_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS)
        self.hub_context.setSingleStep(1024)
        self.hub_context.setValue(context)
        self.hub_context.setSuffix(" tokens")
        self.hub_context.setToolTip(
            "The context each file's fit is judged at: its KV cache grows with it. It starts at the "
            "context chosen in Settings; changing it here changes only this list."
        )
        self.hub_context.valueChanged.connect(self._refit_hub_files)
        self.hub_list_button = QtWidgets.QPushButton("List files")
        self.hub_list_button.clicked.connect(self.list_hub_files)
        self.hub_table = _table(["Quant", "Size", "Needs", "Fits here", "File"])
        self.hub_download_button = QtWidgets.QPushButton("Download file")
        self.hub_download_button.clicked.connect(self.download_hub_file)
        self.use_target_button = QtWidgets.QPushButton("Use as target")
        self.use_draft_button = QtWidgets.QPushButton("Use as draft")
        for button, role in ((self.use_target_button, "target"), (self.use_draft_button, "draft")):
            button.setEnabled(False)
            button.clicked.connect(lambda _=False, role=role: self.model_chosen.emit(role, self._hub_path))

    def _lay_out(self) -> None:
        layout = QtWidgets.QVBoxLayout(self)
        layout.addWidget(QtWidgets.QLabel("<b>Installed</b>"))
        layout.addWidget(self.installed_table, 1)
        layout.addWidget(self.remove_button, 0, Qt.AlignmentFlag.AlignRight)
        layout.addWidget(QtWidgets.QLabel("<b>Suggested pairs</b> (target + draft)"))
        layout.addWidget(self.pairs_table, 1)
        row = QtWidgets.QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.download_button)
        layout.addLayout(row)
        layout.addWidget(QtWidgets.QLabel("<b>GGUF files from the hub</b>"))
        hub = QtWidgets.QHBoxLayout()
        hub.addWidget(self.hub_repo_edit, 1)
        hub.addWidget(QtWidgets.QLabel("Context:"))
        hub.addWidget(self.hub_context)
        hub.addWidget(self.hub_list_button)
        layout.addLayout(hub)
        layout.addWidget(self.hub_table, 1)
        hub_buttons = QtWidgets.QHBoxLayout()
        hub_buttons.addStretch(1)
        for button in (self.hub_download_button, self.use_target_button, self.use_draft_button):
            hub_buttons.addWidget(button)
        layout.addLayout(hub_buttons)
        row = QtWidgets.QHBoxLayout()
        row.addWidget(self.progress_bar, 1)
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
        pair, relay, cancel = self._pairs[row], self._relay, self._start_download(self._pairs[row].label)
        self._downloads.submit("download", lambda: manage.download_pair(pair, relay.progress.emit, cancel))

    def _start_download(self, what: str) -> threading.Event:
        cancel = threading.Event()
        self._cancel = cancel
        self.destroyed.connect(lambda *_: cancel.set())  # a closed manager stops its download
        for button in (
            self.download_button,
            self.hub_download_button,
            self.use_target_button,
            self.use_draft_button,
        ):
            button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress_bar.setVisible(True)
        self.progress_bar.setRange(0, 0)
        self.status_label.setText(f"Downloading {what}…")
        return cancel

    # --- GGUF files from the hub -----------------------------------------------------------------

    @Slot()
    def list_hub_files(self) -> None:
        repo = self.hub_repo_edit.text().strip()
        if not repo:
            self.status_label.setText("Type a repository id, such as bartowski/Llama-3.2-1B-Instruct-GGUF.")
            return
        self.hub_table.setRowCount(0)
        self.hub_list_button.setEnabled(False)
        self.status_label.setText(f"Listing the GGUF files of {repo}…")
        self._lookups.submit("hub-list", lambda: _hub_listing(repo, self.hub_context.value()))

    @Slot(object)
    def follow_config(self, config) -> None:
        """The app's settings changed: a context chosen anew is the one the hub files are judged at
        (another setting's change leaves a context typed here as it is)."""
        if config.context != self._chosen_context:
            self._chosen_context = config.context
            self.hub_context.setValue(config.context)

    @Slot()
    def _refit_hub_files(self) -> None:
        if self._hub_files:
            files, kv, context = self._hub_files, self._hub_kv, self.hub_context.value()
            self._lookups.submit("hub-fit", lambda: (files, kv, _fits(files, kv, context)))

    def _show_hub_files(self, files, kv, fits) -> None:
        self._hub_files, self._hub_kv = files, kv
        self.hub_table.setRowCount(0)
        for row, (entry, (needed, verdict)) in enumerate(zip(files, fits, strict=True)):
            self.hub_table.insertRow(row)
            cells = (entry.quant, _size(entry.size_bytes), _size(needed), verdict, entry.name)
            for column, text in enumerate(cells):
                self.hub_table.setItem(row, column, _item(text))
        fitting = [row for row, (_, verdict) in enumerate(fits) if verdict == "fits"]
        if fitting:
            self.hub_table.selectRow(fitting[-1])  # the largest that fits, as LM Studio suggests

    @Slot()
    def download_hub_file(self) -> None:
        row = self.hub_table.currentRow()
        if not 0 <= row < len(self._hub_files):
            self.status_label.setText("List a repository's files and choose one to download.")
            return
        entry, relay = self._hub_files[row], self._relay
        cancel = self._start_download(entry.name)
        self._downloads.submit("hub-download", lambda: gguf_hub.download(entry, relay.progress.emit, cancel))

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
    def _on_download_done(self, kind: str, _token: int, result, error) -> None:
        self.download_button.setEnabled(True)
        self.hub_download_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.use_target_button.setEnabled(bool(self._hub_path))
        self.use_draft_button.setEnabled(bool(self._hub_path))
        self.progress_bar.setVisible(False)
        if isinstance(error, manage.DownloadCancelled):
            outcome = "cancelled"
            self.status_label.setText(str(error))
        elif error is not None:
            outcome = str(error) if isinstance(error, TandemError) else f"Download failed: {error}"
            self.status_label.setText(outcome)
        elif kind == "hub-download":
            outcome, self._hub_path = "done", str(result)
            self.use_target_button.setEnabled(True)
            self.use_draft_button.setEnabled(True)
            self.status_label.setText(f"Downloaded and checked: {result}. Use it as the target or the draft.")
            self.refresh()
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
                        model.location,
                        model.source,
                    )
                ):
                    self.installed_table.setItem(row, column, _item(text))
            if error:
                self.status_label.setText(f"Could not list the models: {error}")
            self.listed.emit()
        elif kind.startswith("fit:"):
            row = int(kind.partition(":")[2])
            fit, cost = (f"Could not estimate: {error}",) * 2 if error else result
            self.pairs_table.setItem(row, 1, _item(fit))
            self.pairs_table.setItem(row, 2, _item(cost))
        elif kind in ("hub-list", "hub-fit"):
            self.hub_list_button.setEnabled(True)
            if error is not None:
                message = str(error) if isinstance(error, TandemError) else f"Listing failed: {error}"
                self.status_label.setText(message)
                self.hub_listed.emit(message)
                return
            self._show_hub_files(*result)
            if kind == "hub-list":
                self.status_label.setText(f"{len(result[0])} GGUF files. Choose one and download it.")
                self.hub_listed.emit("")

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


def _hub_listing(repo: str, context: int):
    """(files, KV bytes per token, [(bytes needed, verdict)]) for a repository, on the look-up thread."""
    files = gguf_hub.list_gguf_files(repo)
    kv = gguf_hub.remote_kv_bytes_per_token(max(files, key=lambda f: f.size_bytes))
    return files, kv, _fits(files, kv, context)


def _fits(files, kv: int | None, context: int) -> list[tuple[int, str]]:
    fits = []
    for entry in files:
        estimate = gguf_hub.file_fit(entry.size_bytes, kv, context)
        verdict = "split: merge first" if entry.split else estimate.verdict
        fits.append((estimate.total_bytes, verdict + ("" if kv is not None else " (KV cache unknown)")))
    return fits


def pair_fit(pair: manage.SuggestedPair) -> str:
    """Will the pair fit here: for a pair on disk the very line Settings shows for it (one function,
    engine.models.probes.memory_line, at the pair's draft quantization); else the catalogue's estimate."""
    from engine.models import catalog
    from engine.models.loaded import resolve_device

    on_disk = {
        e.spec for e in catalog.list_models(include_catalogue=False) if e.folder or e.source == "builtin"
    }
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
    from dataclasses import replace

    dialog = ModelManager(window, context=window.config.context)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    # the hub files' fit follows a context chosen in Settings while the manager is open
    window.loading.config_applied.connect(dialog.follow_config)
    # a downloaded file chosen as target or draft: the window loads it as Settings would
    dialog.model_chosen.connect(
        lambda role, spec: window.apply_config(replace(window.config, **{role: spec}))
    )
    dialog.open()
    return dialog
