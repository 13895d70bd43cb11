"""The message box under the chat: Enter sends, Shift+Enter starts a new line."""

from __future__ import annotations

from app.qt import Qt, QtWidgets, Signal


class MessageEdit(QtWidgets.QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line."""

    submitted = Signal()

    def keyPressEvent(self, event):  # noqa: N802
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submitted.emit()
            return
        super().keyPressEvent(event)
