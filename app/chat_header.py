"""The bar above the chat: the model switcher, the mark of a conversation's own system prompt, how much
of the context the conversation uses, and the button that shows or hides the side panel.

The context figure is the engine's (EngineInfo.context_length, the tokens the target's cache holds; the
memory estimate in Settings counts the same), and the tokens used are the last reply's prompt and reply
tokens as the engine counted them.
"""

from __future__ import annotations

import html

from app.form_widgets import ComboBox
from app.qt import QtWidgets, Signal, Slot

MAX_NAME_CHARACTERS = 40  # a longer model name is cut at the window's smallest

CONTEXT_TIP = (
    "Tokens of this conversation the model read and wrote at its last reply, of the {limit} it can "
    "hold at once (its context). The engine counts them; a longer conversation must be shortened."
)


def usage_of(stats) -> int:
    """Tokens of the context a reply used: its prompt and what it wrote."""
    return int(stats.prompt_tokens) + int(stats.generated_tokens)


class ChatHeader(QtWidgets.QWidget):
    model_chosen = Signal(str)  # a model spec the user picked
    prompt_clicked = Signal()
    side_panel_toggled = Signal(bool)

    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QtWidgets.QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 2)
        layout.addWidget(QtWidgets.QLabel("Model:", self))
        self.model_combo = ComboBox(self)
        self.model_combo.setSizeAdjustPolicy(QtWidgets.QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.model_combo.setToolTip(
            "The model that answers. Choosing another loads it; this one answers meanwhile."
        )
        self.model_combo.activated.connect(self._on_activated)
        layout.addWidget(self.model_combo)
        self.loading_label = QtWidgets.QLabel(self)
        layout.addWidget(self.loading_label)
        layout.addStretch(1)
        self.prompt_chip = QtWidgets.QToolButton(self)
        self.prompt_chip.setText("✎ Own system prompt")
        self.prompt_chip.setAutoRaise(True)
        self.prompt_chip.clicked.connect(self.prompt_clicked)
        self.prompt_chip.setVisible(False)
        layout.addWidget(self.prompt_chip)
        layout.addWidget(QtWidgets.QLabel("Context:", self))
        self.context_bar = QtWidgets.QProgressBar(self)
        self.context_bar.setTextVisible(False)
        self.context_bar.setFixedWidth(90)
        self.context_bar.setMaximumHeight(12)
        layout.addWidget(self.context_bar)
        self.context_label = QtWidgets.QLabel(self)
        layout.addWidget(self.context_label)
        self.side_button = QtWidgets.QToolButton(self)
        self.side_button.setText("Stats and sampling")
        self.side_button.setCheckable(True)
        self.side_button.setChecked(True)
        self.side_button.setToolTip(
            "Show or hide the panel with this reply's figures and the sampling settings"
        )
        self.side_button.toggled.connect(self.side_panel_toggled)
        layout.addWidget(self.side_button)
        self.limit: int | None = None
        self.used: int | None = None
        self._show_context()

    # --- the model switcher ----------------------------------------------------------------------

    def add_models(self, specs: list[str]) -> None:
        for spec in specs:
            if self.model_combo.findData(spec) < 0:
                self.model_combo.addItem(_label(spec), spec)
        # the whole name of the longest model even at the window's smallest (it read "smollm2" there)
        cap = self.model_combo.fontMetrics().averageCharWidth() * MAX_NAME_CHARACTERS
        self.model_combo.setMinimumWidth(min(self.model_combo.sizeHint().width(), cap))

    def set_model(self, spec: str, loading: bool = False) -> None:
        """The model chosen; `loading`: not answering yet (the status bar shows the load)."""
        self.add_models([spec])
        self.model_combo.setCurrentIndex(self.model_combo.findData(spec))
        self.loading_label.setText("loading…" if loading else "")

    def current_model(self) -> str:
        return self.model_combo.currentData() or ""

    @Slot(int)
    def _on_activated(self, index: int) -> None:
        self.model_chosen.emit(self.model_combo.itemData(index))

    # --- the conversation's own system prompt ----------------------------------------------------

    def set_own_prompt(self, prompt: str | None) -> None:
        """Show the mark while the conversation has a system prompt of its own (None: the default)."""
        self.prompt_chip.setVisible(bool(prompt))
        if prompt:
            self.prompt_chip.setToolTip(
                f"<p>This conversation has its own system prompt (click to change it):</p><p><i>{html.escape(prompt)}</i></p>"
            )

    # --- context usage ---------------------------------------------------------------------------

    def set_context_limit(self, limit: int | None) -> None:
        self.limit = limit
        self._show_context()

    def show_usage(self, stats) -> None:
        self.set_usage(usage_of(stats))

    def set_usage(self, used: int | None) -> None:
        """Tokens the conversation uses (None: not known until its next reply)."""
        self.used = used
        self._show_context()

    def context_text(self) -> str:
        return self.context_label.text()

    def _show_context(self) -> None:
        limit, used = self.limit, self.used
        used_text = "—" if used is None else f"{used:,}"  # — : counted at the conversation's next reply
        self.context_label.setText(f"{used_text} / {limit:,} tokens" if limit else f"{used_text} tokens")
        self.context_bar.setVisible(bool(limit))
        self.context_bar.setMaximum(limit or 1)
        self.context_bar.setValue(min(used or 0, limit or 1))
        tip = CONTEXT_TIP.format(limit=f"{limit:,}" if limit else "tokens it")
        self.context_label.setToolTip(tip)
        self.context_bar.setToolTip(tip)


def _label(spec: str) -> str:
    """A model spec as the switcher lists it: the built-in prefix and folders' parents left out."""
    name = spec.removeprefix("builtin:")
    return name.rstrip("/").rsplit("/", 1)[-1] if name.startswith(("/", ".", "~")) else name


__all__ = ["ChatHeader", "usage_of"]
