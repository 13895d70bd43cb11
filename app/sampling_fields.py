"""The five sampling inputs (temperature, top-p, top-k, max new tokens, seed), built, filled and read in
this one place for both the side panel (app/sampling_panel.py) and the Settings dialog's Sampling tab
(app/settings_pages.py).
"""

from __future__ import annotations

from typing import Any

from app.config import AppConfig
from app.form_widgets import double_spin, spin
from app.qt import QObject, QtWidgets, Signal

TIPS = {
    "temperature": "0 always picks the most likely token (greedy); higher values vary the reply more.",
    "top_p": "Sample only from the most likely tokens whose probabilities add up to p (1 = all).",
    "top_k": "Sample only from the k most likely tokens (off = all).",
    "max_new_tokens": "The longest reply, in tokens.",
    "seed": "The same seed, prompt and settings give the same reply (random = a new one each time).",
}
LABELS = {
    "temperature": "Temperature:",
    "top_p": "Top-p:",
    "top_k": "Top-k:",
    "max_new_tokens": "Max new tokens:",
    "seed": "Seed:",
}


class SamplingFields(QObject):
    """The inputs, with their ranges and tooltips; `changed` whenever one of them changes value."""

    changed = Signal()

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.temperature_spin = double_spin(0.0, 5.0, 0.1)
        self.top_p_spin = double_spin(0.01, 1.0, 0.05)
        self.top_k_spin = spin(0, 100_000)
        self.top_k_spin.setSpecialValueText("off")
        self.max_new_tokens_spin = spin(1, 1_000_000)
        self.seed_spin = spin(-1, 2**31 - 1)
        self.seed_spin.setSpecialValueText("random")
        for key, widget in self._by_field().items():
            widget.setToolTip(TIPS[key])
            widget.valueChanged.connect(lambda _value: self.changed.emit())

    def _by_field(self) -> dict[str, QtWidgets.QAbstractSpinBox]:
        return {
            "temperature": self.temperature_spin,
            "top_p": self.top_p_spin,
            "top_k": self.top_k_spin,
            "max_new_tokens": self.max_new_tokens_spin,
            "seed": self.seed_spin,
        }

    def widgets(self) -> tuple[QtWidgets.QAbstractSpinBox, ...]:
        return tuple(self._by_field().values())

    def add_rows(self, form: QtWidgets.QFormLayout) -> None:
        """One labelled row each, in this order."""
        for key, widget in self._by_field().items():
            form.addRow(LABELS[key], widget)

    def fill(self, config: AppConfig) -> None:
        """Show config's values (each input still emits its own change; block them to stay quiet)."""
        self.temperature_spin.setValue(config.temperature)
        self.top_p_spin.setValue(config.top_p)
        self.top_k_spin.setValue(config.top_k)
        self.max_new_tokens_spin.setValue(config.max_new_tokens)
        self.seed_spin.setValue(-1 if config.seed is None else config.seed)

    def read(self) -> dict[str, Any]:
        """The AppConfig fields the inputs show, for dataclasses.replace."""
        seed = self.seed_spin.value()
        return dict(
            temperature=round(self.temperature_spin.value(), 4),
            top_p=round(self.top_p_spin.value(), 4),
            top_k=self.top_k_spin.value(),
            max_new_tokens=self.max_new_tokens_spin.value(),
            seed=None if seed < 0 else seed,
        )
