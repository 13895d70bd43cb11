"""Message text to rich text: Markdown with highlighted code, and token-provenance colours over it.

Model text is untrusted. markdown-it runs with html=False, so raw HTML comes out escaped; images are off,
so nothing is fetched; links that markdown-it refuses (javascript:, data:, file:) stay plain text.
Control characters (an escape sequence, a carriage return, C1 controls) are shown as symbols, as the
terminal chat shows them (engine.cli.terminal.visible).

Provenance colouring keeps the formatting: the Markdown is rendered as usual, then each character of
the rendered document is matched back to the character of the source text it shows (markup such as
```python or ** has no counterpart and is skipped), and takes the background of the token it came from.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.token import Token
from pygments.util import ClassNotFound

from app.qt import QtGui
from engine.cli.terminal import visible

ALIGN_WINDOW = 48  # how far ahead in the source a rendered character is looked for

PROVENANCE_LABELS = {"draft": "draft accepted", "target": "target / corrected", "bonus": "bonus"}
PROVENANCE_LETTERS = {"draft": "d", "target": "t", "bonus": "b"}
LETTER_PROVENANCE = {v: k for k, v in PROVENANCE_LETTERS.items()}
# (background, text) per provenance; picked so black text stays readable on light and white on dark.
PROVENANCE_COLOURS = {
    False: {
        "draft": ("#c6efce", "#0b3d17"),
        "target": ("#ffe6b0", "#4a3300"),
        "bonus": ("#cfe2ff", "#0a2a5c"),
    },
    True: {
        "draft": ("#1f5130", "#e6ffe9"),
        "target": ("#5c4716", "#fff1d6"),
        "bonus": ("#1f3f73", "#e6eeff"),
    },
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
        f'<tr><td style="color:{theme.muted};"><a name="code-label">{label}</a></td>'
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
        body = _MD.render(visible(text))
    finally:
        renderer.rules = saved
    return body, codes


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


def source_positions(rendered: str, source: str) -> list[int | None]:
    """For each rendered character, the index of the source character it shows, or None.

    Rendering drops markup and keeps the order of the text, so a forward walk that looks a little ahead
    for each character finds it. Whitespace is only matched where it stands, so a paragraph break never
    jumps the walk ahead.
    """
    positions: list[int | None] = []
    cursor = 0
    for char in rendered:
        if char in "\u2028\u2029":
            char = "\n"
        if char.isspace():
            found = cursor if cursor < len(source) and source[cursor].isspace() else -1
        else:
            found = source.find(char, cursor, cursor + ALIGN_WINDOW)
        if found < 0:
            positions.append(None)
            continue
        positions.append(found)
        cursor = found + 1
    return positions


def provenance_per_char(text: str, spans: list[tuple[str, str]]) -> list[str]:
    if "".join(t for t, _ in spans) != text:
        spans = decode_provenance(text, encode_provenance(spans))
    return [provenance for piece, provenance in spans for _ in piece]


def colour_document(
    document: QtGui.QTextDocument, text: str, spans: list[tuple[str, str]], theme: Theme
) -> None:
    """Give every character of a rendered message the background of the token it came from."""
    owners = provenance_per_char(text, spans)
    colours = PROVENANCE_COLOURS[theme.dark]
    rendered_positions, rendered = [], []
    block = document.begin()
    while block.isValid():
        iterator = block.begin()
        while not iterator.atEnd():
            fragment = iterator.fragment()
            fmt = fragment.charFormat()
            if not (fmt.isAnchor() or fmt.anchorNames()):  # "Copy code" and the language label
                position = fragment.position()
                for char in fragment.text():
                    rendered.append(char)
                    rendered_positions.append(position)
                    position += 2 if ord(char) > 0xFFFF else 1  # document positions count UTF-16 units
            iterator += 1
        rendered.append("\n")
        rendered_positions.append(None)
        block = block.next()
    matches = source_positions("".join(rendered), text)
    cursor = QtGui.QTextCursor(document)
    cursor.beginEditBlock()
    run_start, run_end, run_owner = None, None, None

    def paint() -> None:
        if run_owner in colours:
            cursor.setPosition(run_start)
            cursor.setPosition(run_end, QtGui.QTextCursor.MoveMode.KeepAnchor)
            fmt = QtGui.QTextCharFormat()
            fmt.setBackground(QtGui.QColor(colours[run_owner][0]))
            cursor.mergeCharFormat(fmt)

    for position, source_index in zip(rendered_positions, matches, strict=True):
        owner = owners[source_index] if position is not None and source_index is not None else None
        if owner is None:
            continue
        width = 2 if ord(text[source_index]) > 0xFFFF else 1
        if owner == run_owner and position == run_end:
            run_end += width
            continue
        paint()
        run_start, run_end, run_owner = position, position + width, owner
    paint()
    cursor.endEditBlock()
