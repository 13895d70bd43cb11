"""Conversation list (most recent first) with full-text search, new, rename, and delete with undo.

Search shows one hit per message: the conversation's title above a snippet with the match
highlighted. Where several versions (branches) of a message hold the same text, one hit stands for
them, the one on the visible thread if any. Choosing a hit opens its conversation scrolled to it.
Renames, deletes and undos write to the store here; a StorageError is announced with storage_failed.
"""

from __future__ import annotations

import html
import re

from app.qt import Qt, QtCore, QtGui, QTimer, QtWidgets, Signal, Slot
from engine.errors import StorageError

QPoint = QtCore.QPoint

SEARCH_DELAY_MS = 200
UNDO_TIMEOUT_MS = 10000
ID_ROLE = Qt.ItemDataRole.UserRole
MESSAGE_ROLE = Qt.ItemDataRole.UserRole + 1
TITLE_ROLE = Qt.ItemDataRole.UserRole + 2
SNIPPET_MARKS = ("\x02", "\x03")  # cannot appear in typed text, so the highlight markup is ours alone
HIGHLIGHT = "background-color:#ffe58a; color:#1a1a1a;"


def snippet_html(snippet: str) -> str:
    """A search snippet as rich text: escaped, with the matched words highlighted."""
    marked = html.escape(re.sub(r"\s+", " ", snippet))
    return marked.replace("\x02", f'<b style="{HIGHLIGHT}">').replace("\x03", "</b>")


def plain_snippet(snippet: str) -> str:
    return re.sub(r"\s+", " ", snippet).translate({2: None, 3: None})


class Sidebar(QtWidgets.QWidget):
    conversation_selected = Signal(int)
    message_selected = Signal(int, int)  # conversation id, message id (a search hit)
    new_requested = Signal()
    conversation_deleted = Signal(int)
    menu_requested = Signal(int, QPoint)  # conversation id, global position of a right click
    storage_failed = Signal(str, object)  # what could not be done, the StorageError

    def __init__(self, store, parent=None):
        super().__init__(parent)
        self.store = store
        self._deleted: list[int] = []
        self._updating = False

        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.search_box = QtWidgets.QLineEdit(self)
        self.search_box.setPlaceholderText("Search messages (Ctrl+F)")
        self.search_box.setClearButtonEnabled(True)
        self.search_box.textChanged.connect(self._schedule_search)
        self.search_box.returnPressed.connect(self.open_first_hit)
        layout.addWidget(self.search_box)

        buttons = QtWidgets.QHBoxLayout()
        self.new_button = QtWidgets.QPushButton("New chat", self)
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.clicked.connect(self.new_requested)
        self.rename_button = QtWidgets.QPushButton("Rename", self)
        self.rename_button.setToolTip("Rename the selected conversation (F2)")
        self.rename_button.clicked.connect(self.start_rename)
        self.delete_button = QtWidgets.QPushButton("Delete", self)
        self.delete_button.setToolTip("Delete the selected conversation (Delete); it can be undone")
        self.delete_button.clicked.connect(self.delete_selected)
        for button in (self.new_button, self.rename_button, self.delete_button):
            buttons.addWidget(button)
        layout.addLayout(buttons)

        self.list = QtWidgets.QListWidget(self)
        self.list.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.EditKeyPressed)
        self.list.itemChanged.connect(self._on_item_changed)
        self.list.currentItemChanged.connect(self._on_current_changed)
        self.list.itemClicked.connect(self._on_item_clicked)
        self.list.viewport().installEventFilter(self)
        self._opened_by_press = False  # this mouse press already opened the item it made current
        self.list.setWordWrap(True)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._on_context_menu)
        layout.addWidget(self.list, 1)

        self.undo_bar = QtWidgets.QFrame(self)
        undo_layout = QtWidgets.QHBoxLayout(self.undo_bar)
        undo_layout.setContentsMargins(4, 2, 4, 2)
        self.undo_label = QtWidgets.QLabel(self.undo_bar)
        self.undo_label.setWordWrap(True)
        self.undo_button = QtWidgets.QPushButton("Undo", self.undo_bar)
        self.undo_button.clicked.connect(self.undo_delete)
        undo_layout.addWidget(self.undo_label, 1)
        undo_layout.addWidget(self.undo_button)
        self.undo_bar.setVisible(False)
        layout.addWidget(self.undo_bar)

        delete_action = QtGui.QAction("Delete", self.list)
        delete_action.setShortcut(QtGui.QKeySequence.StandardKey.Delete)
        delete_action.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        delete_action.triggered.connect(self.delete_selected)
        self.list.addAction(delete_action)

        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self.refresh)
        self._undo_timer = QTimer(self)
        self._undo_timer.setSingleShot(True)
        self._undo_timer.setInterval(UNDO_TIMEOUT_MS)
        self._undo_timer.timeout.connect(self._hide_undo)

    # --- listing ---------------------------------------------------------------------------------

    def searching(self) -> bool:
        return bool(self.search_box.text().strip())

    @Slot()
    def refresh(self, select_id: int | None = None) -> None:
        """Rebuild the list; keeps the selection (or selects select_id) without re-announcing it."""
        keep = select_id if select_id is not None else self.current_id()
        self._updating = True
        try:
            self.list.clear()
            if self.searching():
                self._fill_search(self.search_box.text())
            else:
                for conversation in self.store.list_conversations():
                    item = QtWidgets.QListWidgetItem(conversation.title or "Untitled")
                    item.setData(ID_ROLE, conversation.id)
                    item.setToolTip(f"Updated {conversation.updated[:16].replace('T', ' ')} UTC")
                    item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
                    self.list.addItem(item)
            if keep is not None and not self.searching():  # a search hit is opened only when chosen
                self._select_quietly(keep)
        finally:
            self._updating = False
        self.rename_button.setEnabled(not self.searching())

    def _fill_search(self, text: str) -> None:
        for hit, title in self.search_hits(text):
            item = QtWidgets.QListWidgetItem()
            item.setData(ID_ROLE, hit.conversation_id)
            item.setData(MESSAGE_ROLE, hit.message_id)
            item.setData(TITLE_ROLE, f"{title}\n{plain_snippet(hit.snippet)}")
            label = QtWidgets.QLabel(f"<b>{html.escape(title)}</b><br>{snippet_html(hit.snippet)}")
            label.setWordWrap(True)
            label.setContentsMargins(4, 3, 4, 3)
            label.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
            self.list.addItem(item)
            self.list.setItemWidget(item, label)
            width = max(self.list.viewport().width() - 8, 120)
            item.setSizeHint(QtCore.QSize(width, label.heightForWidth(width)))
        if self.list.count() == 0:
            item = QtWidgets.QListWidgetItem("No messages match.")
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            self.list.addItem(item)

    def search_hits(self, text: str) -> list:
        """(hit, conversation title) per message, best first; equal texts on sibling branches once."""
        hits = self.store.search(text, marks=SNIPPET_MARKS)
        titles: dict[int, str] = {}
        visible: dict[int, set[int]] = {}
        chosen: dict[tuple[int, str], object] = {}
        for hit in hits:
            conversation_id = hit.conversation_id
            if conversation_id not in titles:
                titles[conversation_id] = self.store.get_conversation(conversation_id).title
                visible[conversation_id] = {m.id for m in self.store.thread(conversation_id)}
            key = (conversation_id, plain_snippet(hit.snippet))
            earlier = chosen.get(key)
            if earlier is None or (
                hit.message_id in visible[conversation_id]
                and earlier.message_id not in visible[conversation_id]
            ):
                chosen[key] = hit
        order = {id(hit): index for index, hit in enumerate(hits)}
        kept = sorted(chosen.values(), key=lambda hit: order[id(hit)])
        return [(hit, titles[hit.conversation_id]) for hit in kept]

    def _select_quietly(self, conversation_id: int) -> None:
        for row in range(self.list.count()):
            item = self.list.item(row)
            if item.data(ID_ROLE) == conversation_id:
                self.list.setCurrentItem(item)
                return

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return item.data(ID_ROLE) if item is not None else None

    def select(self, conversation_id: int) -> None:
        """Select a conversation and announce it, once."""
        self._updating = True
        try:
            self._select_quietly(conversation_id)
        finally:
            self._updating = False
        self.conversation_selected.emit(conversation_id)

    def titles(self) -> list[str]:
        """Each row as text: a title, or for a search hit "title\nsnippet"."""
        items = [self.list.item(row) for row in range(self.list.count())]
        return [item.data(TITLE_ROLE) or item.text() for item in items]

    @Slot()
    def focus_search(self) -> None:
        self.search_box.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.search_box.selectAll()

    @Slot()
    def open_first_hit(self) -> None:
        """Enter in the search box: the search now (not after its typing delay), then its first hit opened."""
        if not self.searching():
            return
        if self._search_timer.isActive():
            self._search_timer.stop()
            self.refresh()
        first = self.list.item(0)
        if first is None or first.data(ID_ROLE) is None:  # "No messages match."
            return
        if self.list.currentItem() is first:  # already current: open it again
            self.message_selected.emit(first.data(ID_ROLE), first.data(MESSAGE_ROLE))
        else:
            self.list.setCurrentItem(first)

    @Slot(str)
    def _schedule_search(self, _text: str) -> None:
        self._search_timer.start()

    @Slot(QtWidgets.QListWidgetItem, QtWidgets.QListWidgetItem)
    def _on_current_changed(self, current, previous) -> None:
        for item, selected in ((previous, False), (current, True)):  # a hit's label follows the selection
            label = self.list.itemWidget(item) if item is not None else None
            if label is not None:
                label.setStyleSheet("color: palette(highlighted-text);" if selected else "")
        if self._updating or current is None or current.data(ID_ROLE) is None:
            return
        message_id = current.data(MESSAGE_ROLE)
        self._opened_by_press = True
        if message_id is not None:
            self.message_selected.emit(current.data(ID_ROLE), message_id)
        else:
            self.conversation_selected.emit(current.data(ID_ROLE))

    @Slot(QtWidgets.QListWidgetItem)
    def _on_item_clicked(self, item) -> None:
        """Clicking the hit that is already current opens it again (scrolled back to the message)."""
        if self._opened_by_press or item.data(MESSAGE_ROLE) is None:
            return
        self.message_selected.emit(item.data(ID_ROLE), item.data(MESSAGE_ROLE))

    def eventFilter(self, watched, event):  # noqa: N802
        if watched is self.list.viewport() and event.type() == QtCore.QEvent.Type.MouseButtonPress:
            self._opened_by_press = False
        return super().eventFilter(watched, event)

    # --- rename ----------------------------------------------------------------------------------

    @Slot()
    def start_rename(self) -> None:
        item = self.list.currentItem()
        if item is not None and not self.searching():
            self.list.editItem(item)

    def rename(self, conversation_id: int, title: str) -> None:
        title = title.strip()
        if title:
            self._write(
                "rename the conversation", lambda: self.store.rename_conversation(conversation_id, title)
            )
        self.refresh()

    def _write(self, what: str, action) -> bool:
        try:
            action()
        except StorageError as exc:
            self.storage_failed.emit(what, exc)
            return False
        return True

    @Slot(QPoint)
    def _on_context_menu(self, position: QPoint) -> None:
        item = self.list.itemAt(position)
        if item is not None and item.data(ID_ROLE) is not None:
            self.menu_requested.emit(item.data(ID_ROLE), self.list.viewport().mapToGlobal(position))

    @Slot(QtWidgets.QListWidgetItem)
    def _on_item_changed(self, item) -> None:
        if self._updating or item.data(ID_ROLE) is None or self.searching():
            return
        # Deferred: rebuilding the list from inside its own itemChanged would delete the edited item.
        conversation_id, title = item.data(ID_ROLE), item.text()
        QTimer.singleShot(0, self, lambda: self.rename(conversation_id, title))

    # --- delete with undo ------------------------------------------------------------------------

    @Slot()
    def delete_selected(self) -> None:
        conversation_id = self.current_id()
        if conversation_id is not None:
            self.delete(conversation_id)

    def delete(self, conversation_id: int) -> None:
        title = self.store.get_conversation(conversation_id).title
        row = self.list.currentRow()
        if not self._write(
            "delete the conversation", lambda: self.store.delete_conversation(conversation_id)
        ):
            return
        self._deleted.append(conversation_id)
        self.undo_label.setText(f"Deleted “{title}”.")
        self.undo_bar.setVisible(True)
        self._undo_timer.start()
        self.conversation_deleted.emit(conversation_id)
        self.refresh()
        if self.list.count():
            self.list.setCurrentRow(min(max(row, 0), self.list.count() - 1))

    @Slot()
    def undo_delete(self) -> None:
        if not self._deleted:
            return
        conversation_id = self._deleted[-1]
        if not self._write(
            "restore the conversation", lambda: self.store.restore_conversation(conversation_id)
        ):
            return
        self._deleted.pop()
        if not self._deleted:
            self._hide_undo()
        self.refresh()
        self.select(conversation_id)

    @Slot()
    def _hide_undo(self) -> None:
        self.undo_bar.setVisible(False)
        self._undo_timer.stop()

    def purge_deleted(self) -> None:
        """Deletions become final when the window closes."""
        self._deleted.clear()
        self.store.purge_deleted()
