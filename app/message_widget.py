"""One message in the chat: who wrote it, its rendered text, a stats footer for replies, and its actions.

Clicking a reply brings its stored stats back into the stats panel; the footer's numbers come from
app/stats_format.py, the same source as the panel's.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from app.markdown_render import PROVENANCE_COLOURS, PROVENANCE_LABELS, Theme, colour_document, render_markdown
from app.qt import Qt, QtCore, QtGui, QTimer, QtWidgets, Signal, Slot
from app.stats_format import footer_line, footer_tooltip
from engine.cli.terminal import visible

COPIED_MS = 1500  # how long a Copy button says "Copied"
WAITING_TEXT = (
    "The reply starts as soon as the model has loaded (the status bar shows how far it is). "
    "Esc stops waiting; your message is kept."
)


@dataclass
class ViewMessage:
    id: int
    role: str
    text: str
    status: str = "complete"
    stats: dict | None = None
    spans: list[tuple[str, str]] | None = None  # (text, provenance) per token, when known
    branch: tuple[int, int] = (1, 1)  # (position among its siblings, sibling count)
    extra: dict = field(default_factory=dict)


class MessageBrowser(QtWidgets.QTextBrowser):
    """A read-only rich-text view as tall as its content; the chat's scroll area does the scrolling."""

    link_activated = Signal(str)
    clicked = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setSizePolicy(QtWidgets.QSizePolicy.Policy.Expanding, QtWidgets.QSizePolicy.Policy.Fixed)
        self.viewport().setAutoFillBackground(False)
        self.document().setDocumentMargin(2)
        self.anchorClicked.connect(self._on_anchor)
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)

    def loadResource(self, kind, url):  # noqa: N802 - nothing in a message may load files or URLs
        return None

    @Slot(QtCore.QUrl)
    def _on_anchor(self, url: QtCore.QUrl) -> None:
        self.link_activated.emit(url.toString())

    @Slot(QtCore.QSizeF)
    def _fit_height(self, size: QtCore.QSizeF) -> None:
        extra = self.frameWidth() * 2
        if self.horizontalScrollBar().isVisible():
            extra += self.horizontalScrollBar().height()
        height = int(size.height()) + extra + 2
        if height != self.height():
            self.setFixedHeight(height)

    def mousePressEvent(self, event):  # noqa: N802
        self.clicked.emit()
        super().mousePressEvent(event)

    def wheelEvent(self, event):  # noqa: N802 - let the chat's scroll area take vertical wheels
        if event.angleDelta().y() != 0 and event.angleDelta().x() == 0:
            event.ignore()
            return
        super().wheelEvent(event)


class ClickableLabel(QtWidgets.QLabel):
    clicked = Signal()

    def mousePressEvent(self, event):  # noqa: N802
        self.clicked.emit()
        super().mousePressEvent(event)


class MessageWidget(QtWidgets.QFrame):
    """One message: who, the text, a stats line for replies, and its actions."""

    copy_requested = Signal(str)
    regenerate_requested = Signal(int)
    answer_requested = Signal(int)  # a question whose reply never came
    edit_requested = Signal(int)
    branch_requested = Signal(int, int)  # message id, step (-1 previous sibling, +1 next)
    stats_requested = Signal(object)  # the ViewMessage whose stats to show
    details_requested = Signal(str, str)

    def __init__(self, message: ViewMessage, theme: Theme, coloured: bool, parent=None):
        super().__init__(parent)
        self.message = message
        self.theme = theme
        self.coloured = coloured
        self.code_blocks: list[str] = []
        self.dirty = False
        self.selected = False
        self.setObjectName("message-" + message.role)
        self.setFrameShape(QtWidgets.QFrame.Shape.StyledPanel)
        self.setAutoFillBackground(True)
        role = QtGui.QPalette.ColorRole
        self.setBackgroundRole(role.AlternateBase if message.role == "user" else role.Base)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(2)

        header = QtWidgets.QHBoxLayout()
        self.role_label = QtWidgets.QLabel(self)
        header.addWidget(self.role_label)
        header.addStretch(1)
        self.branch_label = QtWidgets.QLabel(self)
        self.previous_button = self._tool_button("‹", "Previous version", lambda: self._branch(-1))
        self.next_button = self._tool_button("›", "Next version", lambda: self._branch(+1))
        for widget in (self.previous_button, self.branch_label, self.next_button):
            header.addWidget(widget)
        self.copy_button = self._tool_button("Copy", "Copy this message", self._copy)
        header.addWidget(self.copy_button)
        edit = lambda: self.edit_requested.emit(self.message.id)  # noqa: E731
        if message.role == "assistant":
            self.edit_button = self._tool_button("Edit", "Edit this reply (the original is kept)", edit)
            self.action_button = self._tool_button(
                "Regenerate",
                "Write a new reply (the old one is kept)",
                lambda: self.regenerate_requested.emit(self.message.id),
            )
        else:
            self.edit_button = None
            self.action_button = self._tool_button("Edit", "Edit and resend (the old version is kept)", edit)
        self.answer_button = self._tool_button(
            "Answer",
            "Write the reply this message never got",
            lambda: self.answer_requested.emit(self.message.id),
        )
        for button in (self.edit_button, self.action_button, self.answer_button):
            if button is not None:
                header.addWidget(button)
        layout.addLayout(header)

        self.browser = MessageBrowser(self)
        self.browser.link_activated.connect(self._on_link)
        self.browser.clicked.connect(self._stats_clicked)
        layout.addWidget(self.browser)

        footer = QtWidgets.QHBoxLayout()
        self.stats_label = ClickableLabel(self)
        self.stats_label.setWordWrap(True)
        self.stats_label.setTextFormat(Qt.TextFormat.PlainText)
        self.stats_label.setCursor(Qt.CursorShape.PointingHandCursor)
        self.stats_label.clicked.connect(self._stats_clicked)
        footer.addWidget(self.stats_label, 1)
        self.details_button = self._tool_button("Details…", "Show the technical details", self._details)
        footer.addWidget(self.details_button)
        layout.addLayout(footer)
        self.refresh_chrome()
        self.render()

    def _tool_button(self, text: str, tip: str, handler) -> QtWidgets.QToolButton:
        button = QtWidgets.QToolButton(self)
        button.setText(text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        button.clicked.connect(handler)
        return button

    # --- state -----------------------------------------------------------------------------------

    def refresh_chrome(self) -> None:
        message = self.message
        streaming = message.status in ("streaming", "waiting")
        role = {"user": "You", "assistant": "Assistant", "system": "System"}.get(message.role, message.role)
        status = {
            "streaming": " — writing…",
            "waiting": " — waiting for the model",
            "cancelled": " — stopped",
            "error": " — error",
            "interrupted": " — interrupted",
        }.get(message.status, "")
        if (message.stats or {}).get("edited"):
            status += " — edited"
        self.role_label.setText(f"<b>{role}</b><span style='color:{self.theme.muted};'>{status}</span>")
        index, count = message.branch
        has_branches = count > 1
        self.branch_label.setText(f"{index}/{count}")
        for widget in (self.branch_label, self.previous_button, self.next_button):
            widget.setVisible(has_branches)
        self.previous_button.setEnabled(has_branches and index > 1 and not streaming)
        self.next_button.setEnabled(has_branches and index < count and not streaming)
        self.action_button.setEnabled(not streaming)
        if self.edit_button is not None:
            self.edit_button.setEnabled(not streaming)
        self.answer_button.setVisible(bool(message.extra.get("unanswered")))
        for button in (self.copy_button, self.action_button, self.edit_button):
            if button is not None:
                button.setVisible(message.status != "waiting")
        stats = message.stats or {}
        has_numbers = message.role == "assistant" and "generated_tokens" in stats
        line = footer_line(stats) if has_numbers else ""
        self.stats_label.setText(line)
        self.stats_label.setToolTip(footer_tooltip(stats) if line else "")
        self.stats_label.setStyleSheet(f"color: {self.theme.muted};")
        self.stats_label.setVisible(bool(line))
        self.details_button.setVisible(message.status == "error" and bool(stats.get("error_details")))

    def render(self) -> None:
        self.dirty = False
        message = self.message
        if message.status == "error" and not message.text:
            error = html.escape(visible(str((message.stats or {}).get("error", "The reply failed."))))
            body, self.code_blocks = f'<p style="color:{self.theme.error};">{error}</p>', []
        else:
            body, self.code_blocks = render_markdown(message.text, self.theme)
            if message.status == "error":
                error = html.escape(visible(str((message.stats or {}).get("error", "The reply failed."))))
                body += f'<p style="color:{self.theme.error};">{error}</p>'
        if message.status == "streaming" and not message.text:
            reading = html.escape(message.extra.get("reading", "…"))  # a long prompt being read
            body = f'<p style="color:{self.theme.muted};">{reading}</p>'
        elif message.status == "waiting":
            body = f'<p style="color:{self.theme.muted};">{WAITING_TEXT}</p>'
        self.browser.setHtml(body)
        if self.coloured and message.spans and message.text:
            colour_document(self.browser.document(), message.text, message.spans, self.theme)

    def show_reading(self, text: str) -> None:
        """How far the prompt is read, shown in place of "…" until the reply's first text arrives."""
        self.message.extra["reading"] = text
        if not self.message.text:
            self.render()

    def append_spans(self, spans: list[tuple[str, str]]) -> None:
        self.message.extra.pop("reading", None)
        self.message.text += "".join(text for text, _ in spans)
        if self.message.spans is None:
            self.message.spans = []
        self.message.spans.extend(spans)
        self.dirty = True

    def set_coloured(self, coloured: bool) -> None:
        if coloured != self.coloured:
            self.coloured = coloured
            self.render()

    # --- actions ---------------------------------------------------------------------------------

    @Slot()
    def _copy(self) -> None:
        self.copy_requested.emit(self.message.text)
        self.show_copied()

    def show_copied(self) -> None:
        """The Copy button says "Copied" for a moment, so the click visibly did something."""
        self.copy_button.setText("Copied ✓")
        QTimer.singleShot(COPIED_MS, self, lambda: self.copy_button.setText("Copy"))

    def set_selected(self, selected: bool) -> None:
        """The reply whose stats the panel shows gets a highlighted frame."""
        self.setFrameShape(QtWidgets.QFrame.Shape.Box if selected else QtWidgets.QFrame.Shape.StyledPanel)
        self.setLineWidth(2 if selected else 1)
        self.selected = selected

    def _branch(self, step: int) -> None:
        self.branch_requested.emit(self.message.id, step)

    @Slot()
    def _details(self) -> None:
        stats = self.message.stats or {}
        self.details_requested.emit(stats.get("error", ""), stats.get("error_details", ""))

    @Slot()
    def _stats_clicked(self) -> None:
        if self.message.role == "assistant" and "generated_tokens" in (self.message.stats or {}):
            self.stats_requested.emit(self.message)

    @Slot(str)
    def _on_link(self, href: str) -> None:
        if href.startswith("copy-code:"):
            index = int(href.split(":", 1)[1])
            if 0 <= index < len(self.code_blocks):
                self.copy_requested.emit(self.code_blocks[index])
        elif href.startswith(("http://", "https://")):
            QtGui.QDesktopServices.openUrl(QtCore.QUrl(href))


class ProvenanceLegend(QtWidgets.QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QtWidgets.QHBoxLayout(self)
        layout.setContentsMargins(6, 2, 6, 2)
        self.labels: dict[str, QtWidgets.QLabel] = {}
        for provenance in PROVENANCE_LABELS:
            label = QtWidgets.QLabel(self)
            layout.addWidget(label)
            self.labels[provenance] = label
        layout.addStretch(1)

    def update_counts(self, counts: dict[str, int], theme: Theme) -> None:
        colours = PROVENANCE_COLOURS[theme.dark]
        for provenance, label in self.labels.items():
            background, foreground = colours[provenance]
            label.setText(
                f'<span style="background-color:{background}; color:{foreground};">'
                f"&nbsp;{PROVENANCE_LABELS[provenance]}&nbsp;</span> {counts.get(provenance, 0)}"
            )
