"""The message list of one conversation: streaming, provenance colours with their legend, scrolling.

Rendering lives in app/markdown_render.py and each message's widget in app/message_widget.py.
"""

from __future__ import annotations

from app.markdown_render import (
    PROVENANCE_LABELS,
    Theme,
    decode_provenance,
    encode_provenance,
    render_markdown,
)
from app.message_widget import MessageWidget, ProvenanceLegend, ViewMessage
from app.qt import Qt, QtCore, QtGui, QTimer, QtWidgets, Signal, Slot

RENDER_INTERVAL_MS = 66  # re-render a streaming message at most ~15 times a second
FOLLOW_SLACK_PX = 24  # this close to the bottom counts as "at the bottom" for auto-scroll
VIEW_SETTLE_MS = 150  # after the user scrolls, how long the view stays put before the panel follows

__all__ = ["ChatView", "Theme", "ViewMessage", "decode_provenance", "encode_provenance", "render_markdown"]


class ChatView(QtWidgets.QWidget):
    """The visible thread of one conversation, with a streaming reply at the end."""

    regenerate_requested = Signal(int)
    answer_requested = Signal(int)
    edit_requested = Signal(int)
    branch_requested = Signal(int, int)
    stats_requested = Signal(object)  # the ViewMessage whose stats to show
    reply_in_view = Signal(object)  # the user scrolled the framed reply away: the reply now in view
    colouring_changed = Signal(bool)
    copied = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.theme = Theme.for_palette(self.palette())
        self.coloured = False
        self.widgets: list[MessageWidget] = []
        self.streaming: MessageWidget | None = None
        self.follow = True
        self.pinned: int | None = None  # a message kept in view while the layout settles (a search hit)

        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        bar = QtWidgets.QHBoxLayout()
        bar.setContentsMargins(6, 2, 6, 2)
        self.colour_toggle = QtWidgets.QCheckBox("Colour tokens by origin", self)
        self.colour_toggle.setToolTip(
            "Show where each token came from: proposed by the drafter and accepted, chosen by the target, "
            "or the target's bonus token. Formatting and code highlighting stay as they are."
        )
        self.colour_toggle.toggled.connect(self.set_coloured)
        bar.addWidget(self.colour_toggle)
        self.legend = ProvenanceLegend(self)
        self.legend.setVisible(False)
        bar.addWidget(self.legend, 1)
        layout.addLayout(bar)

        self.scroll = QtWidgets.QScrollArea(self)
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.container = QtWidgets.QWidget(self.scroll)
        self.list_layout = QtWidgets.QVBoxLayout(self.container)
        self.list_layout.setContentsMargins(8, 8, 8, 8)
        self.list_layout.setSpacing(8)
        self.list_layout.addStretch(1)
        self.scroll.setWidget(self.container)
        layout.addWidget(self.scroll, 1)
        scrollbar = self.scroll.verticalScrollBar()
        scrollbar.rangeChanged.connect(self._on_range_changed)
        scrollbar.valueChanged.connect(self._on_scrolled)
        scrollbar.actionTriggered.connect(self._unpin)  # the user moved the scroll bar or the wheel
        self._view_timer = QTimer(self)  # the reply in view, once the scrolling settles
        self._view_timer.setSingleShot(True)
        self._view_timer.setInterval(VIEW_SETTLE_MS)
        self._view_timer.timeout.connect(self._announce_reply_in_view)
        scrollbar.actionTriggered.connect(lambda _action: self._view_timer.start())

        self.placeholder = QtWidgets.QLabel("Start a conversation: type a message below.", self.container)
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.list_layout.insertWidget(0, self.placeholder)

        self._render_timer = QTimer(self)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render_streaming)

    # --- content ---------------------------------------------------------------------------------

    def clear(self) -> None:
        self.pinned = None
        self._render_timer.stop()
        self.streaming = None
        for widget in self.widgets:
            self.list_layout.removeWidget(widget)
            widget.hide()  # deleted later, by the event loop; hidden now so it is never painted again
            widget.deleteLater()
        self.widgets = []
        self.placeholder.setVisible(True)
        self._update_legend()

    def set_messages(self, messages: list[ViewMessage]) -> None:
        self.clear()
        for message in messages:
            self.append_message(message)
        self.follow = True
        self._scroll_to_bottom()

    def append_message(self, message: ViewMessage) -> MessageWidget:
        widget = MessageWidget(message, self.theme, self.coloured, self.container)
        widget.copy_requested.connect(self.copy_text)
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.answer_requested.connect(self.answer_requested)
        widget.edit_requested.connect(self.edit_requested)
        widget.branch_requested.connect(self.branch_requested)
        widget.stats_requested.connect(self.stats_requested)
        widget.details_requested.connect(self.show_details)
        self.list_layout.insertWidget(self.list_layout.count() - 1, widget)
        self.widgets.append(widget)
        self.placeholder.setVisible(False)
        if message.status == "streaming":
            self.streaming = widget
            self._render_timer.start()
        self._update_legend()
        return widget

    def widget_for(self, message_id: int) -> MessageWidget | None:
        return next((w for w in self.widgets if w.message.id == message_id), None)

    def select_message(self, message_id: int | None) -> None:
        """Frame the message whose stats the panel shows (None: frame nothing)."""
        for widget in self.widgets:
            widget.set_selected(widget.message.id == message_id)

    def scroll_to_message(self, message_id: int) -> bool:
        """Stop following the end and bring one message into view, once the layout has its size."""
        widget = self.widget_for(message_id)
        if widget is None:
            return False
        self.follow = False
        self.pinned = message_id
        self._ensure_visible(message_id)
        return True

    def _ensure_visible(self, message_id: int) -> None:
        widget = self.widget_for(message_id)
        if widget is not None:
            self.follow = False
            bar = self.scroll.verticalScrollBar()
            top = widget.mapTo(self.container, QtCore.QPoint(0, 0)).y()
            bar.setValue(max(0, top - 8))

    @Slot(int)
    def _unpin(self, _action: int) -> None:
        self.pinned = None

    @Slot()
    def _announce_reply_in_view(self) -> None:
        """While nothing streams here: when the framed reply has left the view, the reply nearest the
        middle of the view (with figures) is the one the stats panel should show."""
        if self.streaming is not None:
            return
        framed = next((w for w in self.widgets if w.selected), None)
        if framed is not None and self.is_message_visible(framed.message.id):
            return
        middle = self.scroll.verticalScrollBar().value() + self.scroll.viewport().height() / 2
        shown = [
            w
            for w in self.widgets
            if w.message.role == "assistant"
            and "generated_tokens" in (w.message.stats or {})
            and self.is_message_visible(w.message.id)
        ]
        if shown:
            nearest = min(
                shown,
                key=lambda w: abs(w.mapTo(self.container, QtCore.QPoint(0, w.height() // 2)).y() - middle),
            )
            self.reply_in_view.emit(nearest.message)

    def is_message_visible(self, message_id: int) -> bool:
        widget = self.widget_for(message_id)
        if widget is None:
            return False
        top = widget.mapTo(self.container, QtCore.QPoint(0, 0)).y()
        value = self.scroll.verticalScrollBar().value()
        return top < value + self.scroll.viewport().height() and top + widget.height() > value

    def append_spans(self, spans: list[tuple[str, str]]) -> None:
        if self.streaming is not None:
            self.streaming.append_spans(spans)

    def show_reading(self, text: str) -> None:
        """How far the model has read the message, in the reply's placeholder until its text begins."""
        if self.streaming is not None:
            self.streaming.show_reading(text)

    def finish_streaming(self, text: str, status: str, stats: dict | None) -> None:
        """The reply ended: show its final text, status and stats."""
        widget = self.streaming
        if widget is None:
            return
        self._render_timer.stop()
        self.streaming = None
        message = widget.message
        if text and text != message.text:
            message.text = text
            if message.spans is not None and "".join(t for t, _ in message.spans) != text:
                message.spans = decode_provenance(text, encode_provenance(message.spans))
        message.status = status
        message.stats = stats
        widget.refresh_chrome()
        widget.render()
        self._update_legend()

    @Slot()
    def _render_streaming(self) -> None:
        if self.streaming is not None and self.streaming.dirty:
            self.streaming.render()
            self._update_legend()

    # --- colouring -------------------------------------------------------------------------------

    @Slot(bool)
    def set_coloured(self, coloured: bool) -> None:
        self.coloured = coloured
        if self.colour_toggle.isChecked() != coloured:
            self.colour_toggle.setChecked(coloured)
        self.legend.setVisible(coloured)
        for widget in self.widgets:
            widget.set_coloured(coloured)
        self._update_legend()
        self.colouring_changed.emit(coloured)

    def provenance_counts(self) -> dict[str, int]:
        counts = {name: 0 for name in PROVENANCE_LABELS}
        for widget in self.widgets:
            stored = (widget.message.stats or {}).get("provenance_counts")
            if stored and widget is not self.streaming:
                for name in counts:
                    counts[name] += int(stored.get(name, 0))
            elif widget.message.spans:
                for _, provenance in widget.message.spans:
                    if provenance in counts:
                        counts[provenance] += 1
        return counts

    def _update_legend(self) -> None:
        if self.coloured:
            self.legend.update_counts(self.provenance_counts(), self.theme)

    def changeEvent(self, event):  # noqa: N802
        super().changeEvent(event)
        if event.type() in (QtCore.QEvent.Type.PaletteChange, QtCore.QEvent.Type.ApplicationPaletteChange):
            self.theme = Theme.for_palette(self.palette())
            for widget in self.widgets:
                widget.theme = self.theme
                widget.refresh_chrome()
                widget.render()
            self._update_legend()

    # --- scrolling -------------------------------------------------------------------------------

    @Slot(int, int)
    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self.pinned is not None:
            self._ensure_visible(self.pinned)
            return
        if self.follow:
            self.scroll.verticalScrollBar().setValue(maximum)

    @Slot(int)
    def _on_scrolled(self, value: int) -> None:
        if self.pinned is not None:
            return
        self.follow = value >= self.scroll.verticalScrollBar().maximum() - FOLLOW_SLACK_PX

    def _scroll_to_bottom(self) -> None:
        bar = self.scroll.verticalScrollBar()
        bar.setValue(bar.maximum())

    # --- actions ---------------------------------------------------------------------------------

    @Slot(str)
    def copy_text(self, text: str) -> None:
        QtGui.QGuiApplication.clipboard().setText(text)
        self.copied.emit()

    @Slot(str, str)
    def show_details(self, message: str, details: str) -> None:
        box = QtWidgets.QMessageBox(QtWidgets.QMessageBox.Icon.Warning, "Error details", message, parent=self)
        box.setDetailedText(details)
        box.open()
