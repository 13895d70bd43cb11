"""Sampling and drafting beside the chat: each change applies to the next reply, with no reload.

The same settings as the Settings dialog's Speculation and Sampling tabs, and the same widgets
(app/form_widgets.py: a combo or spin box takes the wheel only when focused); the sampling inputs are
the dialog's own group, app/sampling_fields.py. A change emits `changed` with the whole new AppConfig;
the window's loading controller applies it (LoadingController.apply_config), which reloads nothing
for these fields.
"""

from __future__ import annotations

import dataclasses

from app.config import DRAFTERS, AppConfig
from app.form_widgets import choices, form_layout, note_label, select, spin
from app.qt import QtWidgets, Signal, Slot
from app.sampling_fields import SamplingFields
from app.settings_pages import DRAFTER_LABELS, TIPS
from engine.errors import SettingsError
from engine.settings import MAX_K

APPLIES_NOTE = "Changes apply to the next reply; nothing reloads."


class SamplingPanel(QtWidgets.QWidget):
    changed = Signal(object)  # the AppConfig with this panel's values

    def __init__(self, config: AppConfig, parent=None):
        super().__init__(parent)
        self._config = config
        self.drafter_combo = choices({d: DRAFTER_LABELS.get(d, d) for d in DRAFTERS})
        self.adaptive_box = QtWidgets.QCheckBox("Adaptive K")
        self.k_spin = spin(1, MAX_K)
        self.trees_box = QtWidgets.QCheckBox("Token trees")
        self.sampling = SamplingFields(self)
        self.error_label = note_label()
        self.error_label.setStyleSheet("color: #c0392b")
        tips = {
            self.drafter_combo: "drafter",
            self.adaptive_box: "adaptive",
            self.k_spin: "k",
            self.trees_box: "trees",
        }
        for widget, key in tips.items():
            widget.setToolTip(TIPS[key])
        self._inputs = (*tips, *self.sampling.widgets())

        form = form_layout()
        form.addRow("Drafter:", self.drafter_combo)
        form.addRow("", self.adaptive_box)
        form.addRow("K (fixed):", self.k_spin)
        form.addRow("", self.trees_box)
        self.sampling.add_rows(form)
        layout = QtWidgets.QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(note_label(APPLIES_NOTE))
        layout.addWidget(self.error_label)
        layout.addStretch(1)
        self.show_config(config)
        for signal in (
            self.drafter_combo.currentIndexChanged,
            self.adaptive_box.toggled,
            self.k_spin.valueChanged,
            self.trees_box.toggled,
            self.sampling.changed,
        ):
            signal.connect(self._on_edited)

    def show_config(self, config: AppConfig) -> None:
        """Show config without announcing it (it comes from the window, which has it already)."""
        self._config = config
        for widget in self._inputs:
            widget.blockSignals(True)
        select(self.drafter_combo, config.drafter)
        self.adaptive_box.setChecked(config.k_mode == "adaptive")
        self.k_spin.setValue(config.k)
        self.trees_box.setChecked(config.trees)
        self.sampling.fill(config)
        for widget in self._inputs:
            widget.blockSignals(False)
        self.k_spin.setEnabled(config.k_mode == "fixed")
        self.error_label.setText("")

    def config(self) -> AppConfig:
        return dataclasses.replace(
            self._config,
            drafter=self.drafter_combo.currentData(),
            k_mode="adaptive" if self.adaptive_box.isChecked() else "fixed",
            k=self.k_spin.value(),
            trees=self.trees_box.isChecked(),
            **self.sampling.read(),
        )

    @Slot()
    def _on_edited(self, *_args) -> None:
        config = self.config()
        self.k_spin.setEnabled(config.k_mode == "fixed")
        try:
            config.validate()
        except SettingsError as exc:  # e.g. a drafter that needs a draft model where none is named
            self.error_label.setText(str(exc))
            return
        self.error_label.setText("")
        self._config = config
        self.changed.emit(config)
