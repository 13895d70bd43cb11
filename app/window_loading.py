"""The window's loading controller: which models answer, loading new ones, applying settings.

It owns the loads. A load runs on the bridge's loader thread while the engine that answers keeps
answering (app/bridge.py); its progress shows in the status bar (app/load_progress.py), never in a
dialog. Settings that need no model (drafter, K, trees, sampling, stop strings) reach the engine at
its next reply at once; only another target, context, backend or draft model loads anything
(AppConfig.needs_load).
"""

from __future__ import annotations

import dataclasses
import time

from app.bridge import EngineInfo, LoadRequest
from app.config import DRAFTERS, AppConfig
from app.load_progress import LoadProgress, StageClock
from app.qt import QObject, Qt, QTimer, QtWidgets, Signal, Slot
from app.stats_format import describe_drafter, drafter_in_use


class LoadingController(QObject):
    """Bound to one MainWindow: its bridge, store, config and status bar."""

    loaded = Signal(object)  # EngineInfo: a new engine answers from now on
    unavailable = Signal(str)  # a load failed or was cancelled: why, in words
    config_applied = Signal(object)  # the AppConfig now in effect

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.bridge = window.bridge
        self.serving: AppConfig | None = None  # the config whose models answer
        self.wanted: AppConfig | None = None  # the config of the load under way, or of the last one
        self.progress = LoadProgress(window)
        self._in_use: str | None = None  # the drafter the last reply used, in words
        self._optimize_clock = StageClock()
        self._optimize_timer = QTimer(self)  # the optimization's elapsed time moves between its reports
        self._optimize_timer.setInterval(1000)
        self._optimize_timer.timeout.connect(self._show_optimizing)
        self.progress.cancel_requested.connect(self.cancel)
        self.bridge.load_progress.connect(self._on_progress)
        self.bridge.load_failed.connect(self._on_load_failed)
        self.bridge.load_cancelled.connect(self._on_load_cancelled)
        self.bridge.worker.loaded.connect(self._on_loaded)
        self.bridge.loader.optimizing.connect(self._on_optimizing)
        self.bridge.loader.optimized.connect(self._on_optimized)

    @property
    def busy(self) -> bool:
        """A load is under way."""
        return self.bridge.loading

    # --- loads -----------------------------------------------------------------------------------

    def load(self) -> None:
        """Load the models of the window's config beside the engine that answers (if any)."""
        window = self.window
        self.wanted = window.config
        self.bridge.load(LoadRequest.from_config(window.config))
        self.progress.start("Loading models")
        if self.bridge.info is None:
            window.activity_label.setText("Loading models… you can type meanwhile")
        else:
            window.activity_label.setText(f"Loading models… {self.bridge.info.target} answers meanwhile")
        window.update_controls()

    @Slot()
    def cancel(self) -> None:
        self.bridge.cancel_load()

    def switch_target(self, spec: str) -> None:
        """The chat's model switcher: another target; a draft that was a copy of the old one follows."""
        config = self.window.config
        if spec == config.target:
            return
        draft = spec if config.draft == config.target else config.draft
        self.apply_config(dataclasses.replace(config, target=spec, draft=draft))

    @Slot(object)
    def apply_config(self, config: AppConfig) -> None:
        """Settings take effect at once; a load only when the models themselves changed."""
        window = self.window
        window.config = config
        window.write("save the settings", lambda: config.save(window.store))
        if self.bridge.info is not None:  # the engine that answers takes the new settings at its next reply
            self.bridge.apply_settings(config.speculation(), config.sampling())
        if config.needs_load(self.wanted if self.busy else self.serving):
            self.load()
        self.show_models()
        self.config_applied.emit(config)

    def show_models(self, stats=None) -> None:
        """The status bar's models line: the target, the drafter as set now (its `stats`: the drafter
        the last reply actually used, for `auto`) and the device."""
        info = self.bridge.info
        if info is None:
            return
        if stats is not None:
            self._in_use = drafter_in_use(stats)
        self.window.models_label.setText(models_text(info, self.window.config, self._in_use))

    @Slot()
    def open_settings(self) -> None:
        from app.settings_dialog import SettingsDialog

        dialog = SettingsDialog(self.window.config, self.window.store, self.window)
        dialog.applied.connect(self.apply_config)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()

    # --- what the loader reports -----------------------------------------------------------------

    @Slot(str, int, int)
    def _on_progress(self, stage: str, done: int, total: int) -> None:
        self.progress.show_progress(stage, done, total)

    @Slot(object)
    def _on_loaded(self, info: EngineInfo) -> None:
        window = self.window
        if not self.busy:
            self.progress.finish()
        self.serving = self.wanted or window.config
        self._in_use = None
        window.models_label.setText(models_text(info, window.config))
        window.models_label.setToolTip("\n".join(info.notices))
        window.stats_panel.set_drafter(_drafter_of(info, window.config))
        window.activity_label.setText("Ready")
        # the fallback if a later choice fails to load: what loaded, with the settings chosen since
        working = window.config.with_models_of(self.serving)
        window.write("remember the working settings", lambda: working.save_working(window.store))
        # settings changed while it loaded reach the new engine before its first reply
        self.bridge.apply_settings(window.config.speculation(), window.config.sampling())
        window.update_controls()
        self.loaded.emit(info)

    @Slot(str, str)
    def _on_load_failed(self, message: str, details: str) -> None:
        from app.load_recovery import show_load_failure

        self.progress.finish()
        self.wanted = self.serving
        self.unavailable.emit("The models did not load.")
        self.window.update_controls()
        show_load_failure(self.window, message, details)  # the models still loaded keep answering
        self.config_applied.emit(self.window.config)

    @Slot()
    def _on_load_cancelled(self) -> None:
        window = self.window
        self.progress.finish()
        self.wanted = self.serving
        if self.serving is None:
            window.activity_label.setText("Loading cancelled — open Settings (Ctrl+,) to load models")
        else:  # the settings go back to the models that answer, so the next start loads those
            window.config = window.config.with_models_of(self.serving)
            window.write("save the settings", lambda: window.config.save(window.store))
            window.activity_label.setText(f"Loading cancelled — still using {self.bridge.info.target}")
        self.unavailable.emit("Loading was cancelled.")
        window.update_controls()
        self.config_applied.emit(window.config)

    @Slot(str, int, int)
    def _on_optimizing(self, stage: str, done: int, total: int) -> None:
        """The engine's background optimization (ChatEngine.optimize_in_background), with its counts
        and the time left where they allow an estimate."""
        self._optimize_clock.update(stage[:1].upper() + stage[1:], done, total, time.monotonic())
        self._show_optimizing()
        self._optimize_timer.start()

    @Slot()
    def _show_optimizing(self) -> None:
        self.window.optimize_label.setText(self._optimize_clock.text(time.monotonic()))

    @Slot(str)
    def _on_optimized(self, message: str) -> None:
        window = self.window
        self._optimize_timer.stop()
        window.optimize_label.setText("")
        window.statusBar().showMessage(message, 15000)
        tip = window.models_label.toolTip()
        window.models_label.setToolTip("\n".join(filter(None, [tip, message])))


def optimize_label(parent) -> QtWidgets.QLabel:
    """Where the engine's background optimization shows its progress; empty otherwise."""
    label = QtWidgets.QLabel("", parent)
    label.setToolTip("Replies run uncompiled until the compiled path for this machine is ready.")
    return label


def models_text(info: EngineInfo, config: AppConfig, in_use: str | None = None) -> str:
    """e.g. "Target: smollm2-135m   Drafter: automatic; last reply: n-gram lookup   Device: cpu": the
    drafter as set now, and for `auto` the one the last reply used most (`in_use`)."""
    drafter = config.drafter
    if config.backend != "local":
        words = "the server's own"
    elif drafter == "model" and info.draft:
        quantization = f" ({info.quantization})" if info.quantization != "none" else ""
        words = f"draft model {info.draft}{quantization}"
    elif drafter == "auto":
        # info.draft names the drafter itself where no draft model loaded (EngineInfo): no model to name
        among = info.draft and info.draft not in DRAFTERS
        words = "automatic" + (f" (draft model {info.draft} among them)" if among else "")
        words += f"; last reply: {in_use}" if in_use else ""
    else:
        words = describe_drafter(drafter)
    return f"Target: {info.target}   Drafter: {words}   Device: {info.device}"


def _drafter_of(info: EngineInfo, config: AppConfig) -> str:
    """The drafter in GenerationStats' words, for the panel before the first reply."""
    if config.drafter == "model" and info.draft:
        return "model:" + info.draft
    return config.drafter or "none"


__all__ = ["LoadingController", "optimize_label"]
