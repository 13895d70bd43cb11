"""What the window does when the conversation database cannot be written after start-up.

Disk full, a read-only file or another program holding the database raise engine.errors.StorageError.
The window shows the message in a banner above the chat and carries on: what is on screen stays on
screen, a reply keeps streaming, and what could not be saved is written again at the next chance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from app.qt import QtWidgets, Signal
from engine.errors import StorageError

T = TypeVar("T")
KEPT_IN_MEMORY = "Your conversation stays on screen; Tandem saves it again once the database can be written."


class StorageBanner(QtWidgets.QFrame):
    """A dismissable line above the chat saying what could not be saved and why."""

    retry_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setFrameShape(QtWidgets.QFrame.Shape.StyledPanel)
        self.setObjectName("storage-banner")
        layout = QtWidgets.QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        self.label = QtWidgets.QLabel(self)
        self.label.setWordWrap(True)
        layout.addWidget(self.label, 1)
        self.retry_button = QtWidgets.QPushButton("Save again", self)
        self.retry_button.clicked.connect(self.retry_requested)
        layout.addWidget(self.retry_button)
        close = QtWidgets.QToolButton(self)
        close.setText("✕")
        close.setToolTip("Hide this message")
        close.setAutoRaise(True)
        close.clicked.connect(self.hide)
        layout.addWidget(close)
        self.setVisible(False)

    def show_error(self, what: str, error: StorageError) -> None:
        self.label.setText(f"<b>Could not {what}.</b> {error}<br>{KEPT_IN_MEMORY}")
        self.setVisible(True)

    def text(self) -> str:
        return self.label.text() if self.isVisibleTo(self.parentWidget()) else ""


def guarded(banner: StorageBanner, what: str, write: Callable[[], T]) -> tuple[bool, T | None]:
    """Run one store write; on a StorageError show it in the banner and return (False, None)."""
    try:
        result = write()
    except StorageError as exc:
        banner.show_error(what, exc)
        return False, None
    return True, result
