"""Sampling and drafting beside the chat: each change applies to the next reply, with no reload.

The same settings as the Settings dialog's Speculation and Sampling tabs, and the same widgets
(app/form_widgets.py: a combo or spin box takes the wheel only when focused). A change emits
`changed` with the whole new AppConfig; the window's loading controller applies it
(LoadingController.apply_config), which reloads nothing for these fields.
"""

from __future__ import annotations

import dataclasses

from app.config import DRAFTERS, AppConfig
from app.form_widgets import choices, double_spin, form_layout, note_label, select, spin
from app.qt import QtWidgets, Signal, Slot
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
        self.temperature_spin = double_spin(0.0, 5.0, 0.1)
        self.top_p_spin = double_spin(0.01, 1.0, 0.05)
        self.top_k_spin = spin(0, 100_000)
        self.top_k_spin.setSpecialValueText("off")
        self.max_new_tokens_spin = spin(1, 1_000_000)
        self.seed_spin = spin(-1, 2**31 - 1)
        self.seed_spin.setSpecialValueText("random")
        self.error_label = note_label()
        self.error_label.setStyleSheet("color: #c0392b")
        tips = {
            self.drafter_combo: "drafter",
            self.adaptive_box: "adaptive",
            self.k_spin: "k",
            self.trees_box: "trees",
            self.temperature_spin: "temperature",
            self.top_p_spin: "top_p",
            self.top_k_spin: "top_k",
            self.max_new_tokens_spin: "max_new_tokens",
            self.seed_spin: "seed",
        }
        for widget, key in tips.items():
            widget.setToolTip(TIPS[key])
        self._inputs = tuple(tips)

        form = form_layout()
        form.addRow("Drafter:", self.drafter_combo)
        form.addRow("", self.adaptive_box)
        form.addRow("K (fixed):", self.k_spin)
        form.addRow("", self.trees_box)
        form.addRow("Temperature:", self.temperature_spin)
        form.addRow("Top-p:", self.top_p_spin)
        form.addRow("Top-k:", self.top_k_spin)
        form.addRow("Max new tokens:", self.max_new_tokens_spin)
        form.addRow("Seed:", self.seed_spin)
        layout = QtWidgets.QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(note_label(APPLIES_NOTE))
        layout.addWidget(self.error_label)
        layout.addStretch(1)
        self.show_config(config)
        for widget in self._inputs:
            changed = {"QCheckBox": "toggled", "ComboBox": "currentIndexChanged"}.get(
                type(widget).__name__, "valueChanged"
            )
            getattr(widget, changed).connect(self._on_edited)

    def show_config(self, config: AppConfig) -> None:
        """Show config without announcing it (it comes from the window, which has it already)."""
        self._config = config
        for widget in self._inputs:
            widget.blockSignals(True)
        select(self.drafter_combo, config.drafter)
        self.adaptive_box.setChecked(config.k_mode == "adaptive")
        self.k_spin.setValue(config.k)
        self.trees_box.setChecked(config.trees)
        self.temperature_spin.setValue(config.temperature)
        self.top_p_spin.setValue(config.top_p)
        self.top_k_spin.setValue(config.top_k)
        self.max_new_tokens_spin.setValue(config.max_new_tokens)
        self.seed_spin.setValue(-1 if config.seed is None else config.seed)
        for widget in self._inputs:
            widget.blockSignals(False)
        self.k_spin.setEnabled(config.k_mode == "fixed")
        self.error_label.setText("")

    def config(self) -> AppConfig:
        seed = self.seed_spin.value()
        return dataclasses.replace(
            self._config,
            drafter=self.drafter_combo.currentData(),
            k_mode="adaptive" if self.adaptive_box.isChecked() else "fixed",
            k=self.k_spin.value(),
            trees=self.trees_box.isChecked(),
            temperature=round(self.temperature_spin.value(), 4),
            top_p=round(self.top_p_spin.value(), 4),
            top_k=self.top_k_spin.value(),
            max_new_tokens=self.max_new_tokens_spin.value(),
            seed=None if seed < 0 else seed,
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
