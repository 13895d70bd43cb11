"""Loading models and applying settings: the part of the main window that talks to the loader.

A mixin of MainWindow (app/main_window.py); it uses the window's bridge, labels and stats panel.
"""

from __future__ import annotations

from app.bridge import EngineInfo, LoadRequest
from app.config import AppConfig
from app.qt import Qt, QtWidgets, Slot


class ModelLoading:
    # --- models ---------------------------------------------------------------------------------

    def load_models(self) -> None:
        self.activity_label.setText("Loading models…")
        self.progress_dialog = QtWidgets.QProgressDialog("Loading models…", "Cancel", 0, 0, self)
        self.progress_dialog.setWindowTitle("Tandem")
        self.progress_dialog.setMinimumDuration(400)
        self.progress_dialog.setAutoClose(False)
        self.progress_dialog.setAutoReset(False)
        self.progress_dialog.canceled.connect(self.bridge.cancel_load)
        self.bridge.load(LoadRequest.from_config(self.config))
        self._update_controls()

    def _close_progress(self) -> None:
        if self.progress_dialog is not None:
            self.progress_dialog.canceled.disconnect(self.bridge.cancel_load)
            self.progress_dialog.close()
            self.progress_dialog.deleteLater()
            self.progress_dialog = None

    @Slot(str, int, int)
    def _on_progress(self, stage: str, done: int, total: int) -> None:
        self.activity_label.setText(stage + "…")
        if self.progress_dialog is not None:
            self.progress_dialog.setLabelText(stage + "…")
            self.progress_dialog.setMaximum(max(total, 0))
            self.progress_dialog.setValue(min(done, total) if total > 0 else 0)

    def connect_optimizing(self, worker) -> None:
        """The engine's background optimization (ChatEngine.optimize_in_background), in the status bar."""
        worker.optimizing.connect(self._on_optimizing)
        worker.optimized.connect(self._on_optimized)

    @Slot(str, int, int)
    def _on_optimizing(self, stage: str, done: int, total: int) -> None:
        text = stage[:1].upper() + stage[1:]
        self.optimize_label.setText(f"{text}… {done}/{total}" if total > 0 else f"{text}…")

    @Slot(str)
    def _on_optimized(self, message: str) -> None:
        self.optimize_label.setText("")
        self.statusBar().showMessage(message, 15000)
        tip = self.models_label.toolTip()
        self.models_label.setToolTip("\n".join(filter(None, [tip, message])))

    @Slot(object)
    def _on_loaded(self, info: EngineInfo) -> None:
        self._close_progress()
        draft = info.draft or "none"
        if info.quantization != "none":
            draft += f" ({info.quantization})"
        self.models_label.setText(f"Target: {info.target}   Draft: {draft}   Device: {info.device}")
        self.models_label.setToolTip("\n".join(info.notices))
        self.stats_panel.set_drafter(_drafter_of(info, self.config))
        self.activity_label.setText("Ready")
        self.config.save_working(self.store)  # the fallback if a later choice fails to load
        self._update_controls()
        self.models_loaded.emit(info)

    @Slot(str, str)
    def _on_load_failed(self, message: str, details: str) -> None:
        from app.load_recovery import show_load_failure

        self._close_progress()
        self._update_controls()
        show_load_failure(self, message, details)  # the models still loaded keep answering

    @Slot()
    def _on_load_cancelled(self) -> None:
        self._close_progress()
        self.activity_label.setText("Loading cancelled — open Settings (Ctrl+,) to load models")
        self._update_controls()

    @Slot()
    def open_settings(self) -> None:
        from app.settings_dialog import SettingsDialog

        dialog = SettingsDialog(self.config, self.store, self)
        dialog.applied.connect(self.apply_config)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()

    @Slot(object)
    def apply_config(self, config: AppConfig) -> None:
        """Settings take effect at once: a reload only when the models themselves changed."""
        old, self.config = self.config, config
        config.save(self.store)
        if old.models_changed(config) or self.bridge.info is None:
            self.load_models()
        else:
            self.bridge.apply_settings(config.speculation(), config.sampling())


def optimize_label(parent) -> QtWidgets.QLabel:
    """Where the engine's background optimization shows its progress; empty otherwise."""
    label = QtWidgets.QLabel("", parent)
    label.setToolTip("Replies run uncompiled until the compiled path for this machine is ready.")
    return label


def _drafter_of(info: EngineInfo, config: AppConfig) -> str:
    """The drafter in GenerationStats' words, for the panel before the first reply."""
    if config.drafter == "model" and info.draft:
        return "model:" + info.draft
    return config.drafter or "none"
