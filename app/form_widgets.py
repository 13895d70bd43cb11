"""The form inputs every settings surface uses: combo and spin boxes that leave the mouse wheel to the
page until focused, their builders, and wrapped notes under a field.

app/settings_pages.py lays them out in the Settings dialog, app/sampling_panel.py beside the chat.
"""

from __future__ import annotations

from app.qt import Qt, QtWidgets


class _WheelOnlyWithFocus:
    """A combo or spin box that takes the mouse wheel only once it has the focus (a click or Tab): an
    unfocused one passes the wheel on, so the form under the pointer scrolls and no value changes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # not WheelFocus: the wheel gives no focus

    def wheelEvent(self, event):  # noqa: N802
        if not self.hasFocus():
            event.ignore()
            return
        super().wheelEvent(event)


class ComboBox(_WheelOnlyWithFocus, QtWidgets.QComboBox):
    pass


class SpinBox(_WheelOnlyWithFocus, QtWidgets.QSpinBox):
    pass


class DoubleSpinBox(_WheelOnlyWithFocus, QtWidgets.QDoubleSpinBox):
    pass


def form_layout() -> QtWidgets.QFormLayout:
    form = QtWidgets.QFormLayout()
    # Long notes wrap under their field instead of widening the dialog past the screen.
    form.setRowWrapPolicy(QtWidgets.QFormLayout.RowWrapPolicy.WrapLongRows)
    form.setFieldGrowthPolicy(QtWidgets.QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
    return form


def choices(options: dict[str, str]) -> QtWidgets.QComboBox:
    combo = ComboBox()
    set_choices(combo, options)
    return combo


def set_choices(combo: QtWidgets.QComboBox, options: dict[str, str]) -> None:
    """Replace the options, keeping the current one when it is still offered."""
    current = combo.currentData()
    combo.blockSignals(True)
    combo.clear()
    for value, label in options.items():
        combo.addItem(label, value)
    combo.blockSignals(False)
    select(combo, current if current in options else next(iter(options)))


def select(combo: QtWidgets.QComboBox, value: str) -> None:
    index = combo.findData(value)
    combo.setCurrentIndex(max(index, 0))


def spin(low: int, high: int) -> QtWidgets.QSpinBox:
    box = SpinBox()
    box.setRange(low, high)
    return box


def double_spin(low: float, high: float, step: float) -> QtWidgets.QDoubleSpinBox:
    box = DoubleSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setDecimals(2)
    return box


class NoteLabel(QtWidgets.QLabel):
    """A wrapped note under a field, hidden while empty."""

    def setText(self, text: str) -> None:  # noqa: N802
        super().setText(text)
        if text and self.parent() is None:
            return  # showing a label without a parent would open it as a window of its own
        self.setVisible(bool(text))


def note_label(text: str = "") -> QtWidgets.QLabel:
    label = NoteLabel(text)
    label.setHidden(not text)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    # taller than its text at times (a wrapped label's hint guesses a narrow width), never cut; the
    # text sits under its field and any spare height below it
    label.setSizePolicy(QtWidgets.QSizePolicy.Policy.Preferred, QtWidgets.QSizePolicy.Policy.MinimumExpanding)
    label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
    return label
