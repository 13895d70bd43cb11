"""About Tandem and its keyboard shortcuts, read from the window's own actions so the list cannot drift."""

from __future__ import annotations

import html

from app.qt import QtGui, QtWidgets
from engine import __version__

ABOUT = (
    "Tandem is a chat app for language models that run on this computer. It answers faster with "
    "speculative decoding: a small drafter proposes a few tokens, the model checks them all in one "
    "step and keeps exactly what it would have written itself, so the reply is the model's own."
)
EXTRA_KEYS = (
    ("Enter", "Send the message"),
    ("Shift+Enter", "New line in the message"),
    ("Delete", "Delete the selected conversation (with undo)"),
    ("F2", "Rename the selected conversation"),
)


def shortcut_rows(actions: list[QtGui.QAction]) -> list[tuple[str, str]]:
    rows = [
        (
            action.shortcut().toString(QtGui.QKeySequence.SequenceFormat.NativeText),
            action.text().rstrip("…").replace("&", ""),
        )
        for action in actions
        if not action.shortcut().isEmpty()
    ]
    return rows + list(EXTRA_KEYS)


class HelpDialog(QtWidgets.QDialog):
    def __init__(self, actions: list[QtGui.QAction], parent=None):
        super().__init__(parent)
        self.setWindowTitle("About Tandem")
        layout = QtWidgets.QVBoxLayout(self)
        about = QtWidgets.QLabel(f"<h3>Tandem {html.escape(__version__)}</h3><p>{html.escape(ABOUT)}</p>")
        about.setWordWrap(True)
        layout.addWidget(about)
        layout.addWidget(QtWidgets.QLabel("<b>Keyboard shortcuts</b>"))
        self.table = QtWidgets.QTableWidget(0, 2, self)
        self.table.setHorizontalHeaderLabels(["Keys", "Does"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.NoEditTriggers)
        for keys, does in shortcut_rows(actions):
            row = self.table.rowCount()
            self.table.insertRow(row)
            self.table.setItem(row, 0, QtWidgets.QTableWidgetItem(keys))
            self.table.setItem(row, 1, QtWidgets.QTableWidgetItem(does))
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setStretchLastSection(True)
        layout.addWidget(self.table, 1)
        buttons = QtWidgets.QDialogButtonBox(QtWidgets.QDialogButtonBox.StandardButton.Close, parent=self)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.resize(480, 460)

    def rows(self) -> list[tuple[str, str]]:
        return [
            (self.table.item(r, 0).text(), self.table.item(r, 1).text()) for r in range(self.table.rowCount())
        ]
