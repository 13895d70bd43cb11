"""When models fail to load: the last working pair keeps answering, and the way back is one click.

The worker keeps its engine until a new one has loaded (app/bridge.py), so after a failed load the
old models still answer. This module makes the window say so, puts the saved settings back to the
last config whose models loaded (so the next start does not meet the same error), and offers
"Use the built-in model" in the error dialog.
"""

from __future__ import annotations

import dataclasses

from app.config import DEFAULT_DRAFTER, AppConfig
from app.qt import Qt, QtWidgets
from engine.models.builtin import DEFAULT_TARGET

USE_BUILTIN = "Use the built-in model"


def builtin_config(config: AppConfig) -> AppConfig:
    """config with the built-in pair on this computer; sampling and the system prompt are kept."""
    return dataclasses.replace(
        config,
        backend="local",
        target=DEFAULT_TARGET,
        draft=DEFAULT_TARGET,
        drafter=DEFAULT_DRAFTER,
        draft_quantization="auto",
        draft_on_cpu=False,
        device="auto",
        dtype="auto",
        compiled="auto",
    )


def show_load_failure(window, message: str, details: str) -> QtWidgets.QMessageBox:
    """Update the status bar and settings after a failed load, and open the error dialog (returned)."""
    info = window.bridge.info
    if info is None:
        window.models_label.setText("No model loaded")
        window.activity_label.setText("Loading failed")
    else:
        window.activity_label.setText(f"Loading failed — still using {info.target}")
        working = AppConfig.load_working(window.store)
        if working is not None:
            window.config = working
            working.save(window.store)
            message += f"\n\nTandem keeps using {working.target}, which is still loaded."
    box = QtWidgets.QMessageBox(
        QtWidgets.QMessageBox.Icon.Warning, "Could not load the models", message, parent=window
    )
    box.setDetailedText(details)
    builtin = box.addButton(USE_BUILTIN, QtWidgets.QMessageBox.ButtonRole.AcceptRole)
    settings = box.addButton("Open Settings…", QtWidgets.QMessageBox.ButtonRole.ActionRole)
    box.addButton(QtWidgets.QMessageBox.StandardButton.Close)
    builtin.clicked.connect(lambda: window.apply_config(builtin_config(window.config)))
    settings.clicked.connect(window.open_settings)
    window.load_error_box = box
    box.setWindowModality(Qt.WindowModality.NonModal)  # the models still loaded keep answering meanwhile
    box.show()
    return box


def start_check(config: AppConfig) -> None:
    """Raise TandemError when the saved models cannot be found; cheap enough for the GUI thread."""
    from engine.models.loading import spec_kind
    from engine.settings import needs_draft_model

    if config.backend != "local":
        return
    spec_kind(config.target)
    if needs_draft_model(config.drafter) and config.draft:
        spec_kind(config.draft)
