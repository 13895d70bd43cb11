"""The message list: Markdown with highlighted code, streaming, token provenance colours, per-message actions.

Model text is untrusted. markdown-it runs with html=False, so raw HTML comes out escaped; images are off,
so nothing is fetched; links that markdown-it refuses (javascript:, data:, file:) stay plain text; and
the browsers never follow a link themselves.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.token import Token
from pygments.util import ClassNotFound

from app.qt import Qt, QtCore, QtGui, QTimer, QtWidgets, Signal, Slot

RENDER_INTERVAL_MS = 66  # re-render a streaming message at most ~15 times a second
FOLLOW_SLACK_PX = 24  # this close to the bottom counts as "at the bottom" for auto-scroll

PROVENANCE_LABELS = {"draft": "draft accepted", "target": "target / corrected", "bonus": "bonus"}
PROVENANCE_LETTERS = {"draft": "d", "target": "t", "bonus": "b"}
LETTER_PROVENANCE = {v: k for k, v in PROVENANCE_LETTERS.items()}
# (background, text) per provenance; picked so black text stays readable on light and white on dark.
PROVENANCE_COLOURS = {
    False: {"draft": ("#c6efce", "#0b3d17"), "target": ("#ffe6b0", "#4a3300"), "bonus": ("#cfe2ff", "#0a2a5c")},
    True: {"draft": ("#1f5130", "#e6ffe9"), "target": ("#5c4716", "#fff1d6"), "bonus": ("#1f3f73", "#e6eeff")},
}


@dataclass
class Theme:
    dark: bool
    code_style: str
    code_background: str
    code_foreground: str
    inline_code_background: str
    muted: str
    error: str

    @classmethod
    def for_palette(cls, palette: QtGui.QPalette) -> Theme:
        dark = palette.color(QtGui.QPalette.ColorRole.Base).lightness() < 128
        code_style = "monokai" if dark else "friendly"
        style = get_style_by_name(code_style)
        foreground = style.style_for_token(Token.Text).get("color")
        return cls(
            dark=dark,
            code_style=code_style,
            code_background=style.background_color or ("#272822" if dark else "#f0f0f0"),
            code_foreground=f"#{foreground}" if foreground else ("#f8f8f2" if dark else "#1e1e1e"),
            inline_code_background="#3a3d41" if dark else "#ececec",
            muted="#a0a4aa" if dark else "#60656b",
            error="#ff8a80" if dark else "#b00020",
        )


# --- rendering (pure functions of text) --------------------------------------------------------------


def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True})
    md.enable("table").enable("strikethrough").disable("image")
    return md


_MD = _markdown()


def _code_html(code: str, language: str, index: int, theme: Theme) -> str:
    try:
        lexer = get_lexer_by_name(language) if language else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    formatter = HtmlFormatter(noclasses=True, nowrap=True, style=theme.code_style)
    body = highlight(code, lexer, formatter)
    label = html.escape(language or "code")
    return (
        f'<table width="100%" cellspacing="0" cellpadding="6" style="background-color:{theme.code_background};">'
        f'<tr><td style="color:{theme.muted};">{label}</td>'
        f'<td align="right"><a href="copy-code:{index}">Copy code</a></td></tr>'
        f'<tr><td colspan="2"><pre style="color:{theme.code_foreground}; margin:0;">{body}</pre></td></tr>'
        "</table>"
    )


def render_markdown(text: str, theme: Theme) -> tuple[str, list[str]]:
    """HTML for a QTextDocument, and the raw text of every code block (for its Copy link)."""
    codes: list[str] = []

    def fence(tokens, idx, options, env):
        token = tokens[idx]
        language = token.info.strip().split(maxsplit=1)[0] if token.info.strip() else ""
        codes.append(token.content)
        return _code_html(token.content, language, len(codes) - 1, theme)

    def code_inline(tokens, idx, options, env):
        content = html.escape(tokens[idx].content)
        return f'<code style="background-color:{theme.inline_code_background};">{content}</code>'

    renderer = _MD.renderer
    saved = dict(renderer.rules)
    renderer.rules["fence"] = fence
    renderer.rules["code_block"] = fence
    renderer.rules["code_inline"] = code_inline
    try:
        body = _MD.render(text)
    finally:
        renderer.rules = saved
    return body, codes


def render_provenance(spans: list[tuple[str, str]], theme: Theme) -> str:
    """Plain text with each token's background showing where it came from."""
    colours = PROVENANCE_COLOURS[theme.dark]
    parts = []
    for text, provenance in spans:
        escaped = html.escape(text).replace("\n", "<br>")
        if provenance in colours:
            background, foreground = colours[provenance]
            parts.append(f'<span style="background-color:{background}; color:{foreground};">{escaped}</span>')
        else:
            parts.append(escaped)
    return f'<p style="white-space:pre-wrap;">{"".join(parts)}</p>'


def encode_provenance(spans: list[tuple[str, str]]) -> list[list]:
    """Runs of [characters, letter] for storing with a message's stats."""
    runs: list[list] = []
    for text, provenance in spans:
        letter = PROVENANCE_LETTERS.get(provenance, "t")
        if runs and runs[-1][1] == letter:
            runs[-1][0] += len(text)
        else:
            runs.append([len(text), letter])
    return runs


def decode_provenance(text: str, runs: list) -> list[tuple[str, str]]:
    spans, position = [], 0
    for count, letter in runs:
        spans.append((text[position : position + count], LETTER_PROVENANCE.get(letter, "target")))
        position += count
    if position < len(text):
        spans.append((text[position:], ""))
    return spans


def format_stats_line(stats: dict) -> str:
    parts = []
    tokens = stats.get("generated_tokens")
    if tokens:
        parts.append(f"{tokens} tokens")
    speed = stats.get("decode_tokens_per_s") or stats.get("tokens_per_s")
    if speed:
        parts.append(f"{speed:.1f} tok/s")
    rate = stats.get("acceptance_rate")
    if rate is not None:
        parts.append(f"{rate:.0%} accepted")
    length = stats.get("mean_accepted_length")
    if length:
        parts.append(f"{length:.2f} tokens/round")
    speedup = stats.get("speedup")
    if speedup:
        parts.append(f"{speedup:.2f}× vs target alone")
    drafter = stats.get("drafter")
    if drafter:
        parts.append(f"drafter {drafter}")
    return " · ".join(parts)


def format_stats_tooltip(stats: dict) -> str:
    rows = [
        ("Drafter", stats.get("drafter")),
        ("K", f"{stats.get('k_mode')} (last {stats.get('current_k')})" if stats.get("k_mode") else None),
        ("Rounds", stats.get("rounds")),
        ("Drafted / accepted", f"{stats.get('drafted')} / {stats.get('accepted')}" if "drafted" in stats else None),
        ("Prompt tokens", stats.get("prompt_tokens")),
        ("Time to first token", f"{stats['ttft_s']:.2f} s" if stats.get("ttft_s") is not None else None),
        ("Total time", f"{stats['total_time_s']:.2f} s" if stats.get("total_time_s") else None),
        ("Note", stats.get("note") or None),
    ]
    cells = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>" for k, v in rows if v is not None)
    return f"<table>{cells}</table>" if cells else ""


# --- widgets -----------------------------------------------------------------------------------------


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
    edit_requested = Signal(int)
    branch_requested = Signal(int, int)  # message id, step (-1 previous sibling, +1 next)
    stats_requested = Signal(object)  # stats dict
    details_requested = Signal(str, str)

    def __init__(self, message: ViewMessage, theme: Theme, coloured: bool, parent=None):
        super().__init__(parent)
        self.message = message
        self.theme = theme
        self.coloured = coloured
        self.code_blocks: list[str] = []
        self.dirty = False
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
        if message.role == "assistant":
            self.action_button = self._tool_button(
                "Regenerate", "Write a new reply (the old one is kept)", lambda: self.regenerate_requested.emit(self.message.id)
            )
        else:
            self.action_button = self._tool_button(
                "Edit", "Edit and resend (the old version is kept)", lambda: self.edit_requested.emit(self.message.id)
            )
        header.addWidget(self.action_button)
        layout.addLayout(header)

        self.browser = MessageBrowser(self)
        self.browser.link_activated.connect(self._on_link)
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
        streaming = message.status == "streaming"
        role = {"user": "You", "assistant": "Assistant", "system": "System"}.get(message.role, message.role)
        status = {"streaming": " — writing…", "cancelled": " — stopped", "error": " — error",
                  "interrupted": " — interrupted"}.get(message.status, "")
        self.role_label.setText(f"<b>{role}</b><span style='color:{self.theme.muted};'>{status}</span>")
        index, count = message.branch
        has_branches = count > 1
        self.branch_label.setText(f"{index}/{count}")
        for widget in (self.branch_label, self.previous_button, self.next_button):
            widget.setVisible(has_branches)
        self.previous_button.setEnabled(has_branches and index > 1 and not streaming)
        self.next_button.setEnabled(has_branches and index < count and not streaming)
        self.action_button.setEnabled(not streaming)
        stats = message.stats or {}
        line = format_stats_line(stats) if message.role == "assistant" else ""
        self.stats_label.setText(line)
        self.stats_label.setToolTip(format_stats_tooltip(stats) if line else "")
        self.stats_label.setStyleSheet(f"color: {self.theme.muted};")
        self.stats_label.setVisible(bool(line))
        self.details_button.setVisible(message.status == "error" and bool(stats.get("error_details")))

    def render(self) -> None:
        self.dirty = False
        message = self.message
        if message.status == "error" and not message.text:
            error = html.escape((message.stats or {}).get("error", "The reply failed."))
            body, self.code_blocks = f'<p style="color:{self.theme.error};">{error}</p>', []
        elif self.coloured and message.spans is not None:
            body, self.code_blocks = render_provenance(message.spans, self.theme), []
        else:
            body, self.code_blocks = render_markdown(message.text, self.theme)
            if message.status == "error":
                error = html.escape((message.stats or {}).get("error", "The reply failed."))
                body += f'<p style="color:{self.theme.error};">{error}</p>'
        if message.status == "streaming" and not message.text:
            body = f'<p style="color:{self.theme.muted};">…</p>'
        self.browser.setHtml(body)

    def append_spans(self, spans: list[tuple[str, str]]) -> None:
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

    def _branch(self, step: int) -> None:
        self.branch_requested.emit(self.message.id, step)

    @Slot()
    def _details(self) -> None:
        stats = self.message.stats or {}
        self.details_requested.emit(stats.get("error", ""), stats.get("error_details", ""))

    @Slot()
    def _stats_clicked(self) -> None:
        if self.message.stats:
            self.stats_requested.emit(self.message.stats)

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


class ChatView(QtWidgets.QWidget):
    """The visible thread of one conversation, with a streaming reply at the end."""

    regenerate_requested = Signal(int)
    edit_requested = Signal(int)
    branch_requested = Signal(int, int)
    stats_requested = Signal(object)
    colouring_changed = Signal(bool)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.theme = Theme.for_palette(self.palette())
        self.coloured = False
        self.widgets: list[MessageWidget] = []
        self.streaming: MessageWidget | None = None
        self.follow = True

        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        bar = QtWidgets.QHBoxLayout()
        bar.setContentsMargins(6, 2, 6, 2)
        self.colour_toggle = QtWidgets.QCheckBox("Colour tokens by origin", self)
        self.colour_toggle.setToolTip(
            "Show where each token came from: proposed by the drafter and accepted, chosen by the target, "
            "or the target's bonus token. Text shows unformatted while colours are on."
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

        self.placeholder = QtWidgets.QLabel("Start a conversation: type a message below.", self.container)
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.list_layout.insertWidget(0, self.placeholder)

        self._render_timer = QTimer(self)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render_streaming)

    # --- content ---------------------------------------------------------------------------------

    def clear(self) -> None:
        self._render_timer.stop()
        self.streaming = None
        for widget in self.widgets:
            self.list_layout.removeWidget(widget)
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

    def append_spans(self, spans: list[tuple[str, str]]) -> None:
        if self.streaming is not None:
            self.streaming.append_spans(spans)

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
        if event.type() == QtCore.QEvent.Type.PaletteChange:
            self.theme = Theme.for_palette(self.palette())
            for widget in self.widgets:
                widget.theme = self.theme
                widget.refresh_chrome()
                widget.render()
            self._update_legend()

    # --- scrolling -------------------------------------------------------------------------------

    @Slot(int, int)
    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self.follow:
            self.scroll.verticalScrollBar().setValue(maximum)

    @Slot(int)
    def _on_scrolled(self, value: int) -> None:
        self.follow = value >= self.scroll.verticalScrollBar().maximum() - FOLLOW_SLACK_PX

    def _scroll_to_bottom(self) -> None:
        bar = self.scroll.verticalScrollBar()
        bar.setValue(bar.maximum())

    # --- actions ---------------------------------------------------------------------------------

    @Slot(str)
    def copy_text(self, text: str) -> None:
        QtGui.QGuiApplication.clipboard().setText(text)

    @Slot(str, str)
    def show_details(self, message: str, details: str) -> None:
        box = QtWidgets.QMessageBox(QtWidgets.QMessageBox.Icon.Warning, "Error details", message, parent=self)
        box.setDetailedText(details)
        box.open()
