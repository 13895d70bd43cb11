"""The message box under the chat (Enter sends, Shift+Enter starts a new line), and editing messages.

A question is edited in the message box and sent again as a new version of it; a reply is edited in a
dialog and saved as a new version. Either way the original stays, one click away (‹ ›).
"""

from __future__ import annotations

from app.qt import QObject, Qt, QtWidgets, Signal, Slot


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


class ReplyEditDialog(QtWidgets.QDialog):
    """Edit a reply's text; saving keeps the original as another version of it."""

    def __init__(self, text: str, parent: QtWidgets.QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Edit the reply")
        self.edit = QtWidgets.QPlainTextEdit(text)
        buttons = QtWidgets.QDialogButtonBox(
            QtWidgets.QDialogButtonBox.StandardButton.Save | QtWidgets.QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QtWidgets.QVBoxLayout(self)
        note = "The edited reply is saved as a new version; the original stays (‹ › above the reply)."
        layout.addWidget(QtWidgets.QLabel(note))
        layout.addWidget(self.edit, 1)
        layout.addWidget(buttons)
        self.resize(640, 420)

    def text(self) -> str:
        return self.edit.toPlainText()


class MessageEditor(QObject):
    """Bound to one MainWindow: the message being edited, its banner, and edited replies."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.editing_id: int | None = None  # a question being edited in the message box

    @Slot(int)
    def start(self, message_id: int) -> None:
        window = self.window
        if window.replies.busy:
            return
        message = window.store.get_message(message_id)
        if message.role == "assistant":
            dialog = ReplyEditDialog(message.content, window)
            dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            dialog.accepted.connect(lambda: self.save_reply(message_id, dialog.text()))
            dialog.open()
            return
        self.editing_id = message_id
        window.message_edit.setPlainText(message.content)
        window.edit_banner.setText("  Editing a message: Enter sends it as a new version, Esc cancels.")
        window.edit_banner.setVisible(True)
        window.message_edit.setFocus()

    def cancel(self) -> None:
        if self.editing_id is not None:
            self.editing_id = None
            self.window.message_edit.clear()
        self.window.edit_banner.setVisible(False)

    def save_reply(self, message_id: int, text: str) -> None:
        """An edited reply becomes a new version of it; it carries no generation figures, since the
        model did not write it."""
        window, store = self.window, self.window.store
        old = store.get_message(message_id)
        if not text.strip() or text == old.content:
            return
        meta = {key: (old.stats or {}).get(key) for key in ("target", "draft", "quantization", "device")}
        stats = {**meta, "edited": True}
        ok, _ = window.write(
            "save the edited reply",
            lambda: store.add_message(
                old.conversation_id, "assistant", text, parent_id=old.parent_id, stats=stats
            ),
        )
        if ok:
            window.show_thread()
            window.stats_panel.reset()
