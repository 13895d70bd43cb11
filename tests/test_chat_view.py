"""The chat view alone: safe Markdown, highlighted code with copy links, provenance colours, streaming, scrolling."""

from __future__ import annotations

import pytest

from app.chat_view import (
    RENDER_INTERVAL_MS,
    ChatView,
    Theme,
    ViewMessage,
    decode_provenance,
    encode_provenance,
    render_markdown,
)
from app.markdown_render import PROVENANCE_COLOURS, source_positions
from app.qt import Qt, QtGui, QtWidgets
from app.stats_format import footer_line

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")

LIGHT = Theme(False, "friendly", "#f0f0f0", "#1e1e1e", "#ececec", "#60656b", "#b00020")


@pytest.fixture
def view(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show()
    return view


def test_markdown_escapes_raw_html_and_refuses_script_links():
    body, codes = render_markdown(
        "<script>alert(1)</script>\n\n<img src=x onerror=alert(1)> [x](javascript:alert(1)) ![i](http://h/i.png)",
        LIGHT,
    )
    assert "<script" not in body and "&lt;script&gt;" in body
    assert "<img" not in body and "&lt;img src=x" in body
    assert 'href="javascript' not in body
    assert codes == []


def test_code_blocks_are_highlighted_inline_and_listed_for_copy():
    body, codes = render_markdown("Here:\n\n```python\ndef f():\n    return 1\n```\n\nand `inline`", LIGHT)
    assert codes == ["def f():\n    return 1\n"]
    assert 'href="copy-code:0"' in body
    assert "style=" in body and "class=" not in body  # Qt ignores CSS classes
    assert "<code style=" in body


def test_code_copy_link_and_message_copy_use_the_clipboard(view, qtbot):
    view.set_messages([ViewMessage(1, "assistant", "Try:\n\n```sh\necho hi\n```\n")])
    widget = view.widgets[0]
    widget._on_link("copy-code:0")
    assert QtGui.QGuiApplication.clipboard().text() == "echo hi\n"
    with qtbot.waitSignal(view.copied, timeout=1000):
        widget.copy_button.click()
    assert QtGui.QGuiApplication.clipboard().text().startswith("Try:")
    assert widget.copy_button.text() == "Copied ✓"
    qtbot.waitUntil(lambda: widget.copy_button.text() == "Copy", timeout=3000)


def test_provenance_runs_round_trip():
    spans = [("Hel", "draft"), ("lo", "draft"), (",", "target"), (" world", "bonus")]
    runs = encode_provenance(spans)
    assert runs == [[5, "d"], [1, "t"], [6, "b"]]
    assert decode_provenance("Hello, world!", runs) == [
        ("Hello", "draft"),
        (",", "target"),
        (" world", "bonus"),
        ("!", ""),
    ]


def test_colouring_toggle_shows_legend_counts_and_coloured_spans(view):
    spans = [("a", "draft"), ("b", "draft"), ("c", "target"), ("d", "bonus")]
    view.set_messages([ViewMessage(1, "assistant", "abcd", spans=list(spans))])
    assert not view.legend.isVisibleTo(view)
    view.colour_toggle.setChecked(True)
    assert view.legend.isVisibleTo(view)
    assert view.provenance_counts() == {"draft": 2, "target": 1, "bonus": 1}
    assert view.legend.labels["draft"].text().endswith("draft accepted&nbsp;</span> 2")
    assert backgrounds(view.widgets[0].browser) == ["#c6efce", "#c6efce", "#ffe6b0", "#cfe2ff"]
    view.colour_toggle.setChecked(False)
    assert "#c6efce" not in backgrounds(view.widgets[0].browser)


def backgrounds(browser) -> list[str | None]:
    """The background colour of each character of a rendered message, in order."""
    document, colours = browser.document(), []
    cursor = QtGui.QTextCursor(document)
    for position in range(1, document.characterCount()):
        cursor.setPosition(position)
        char = document.characterAt(position - 1)
        if char.isspace() or char in "\u2029\u2028":
            continue
        brush = cursor.charFormat().background()
        colours.append(brush.color().name() if brush.style() != Qt.BrushStyle.NoBrush else None)
    return colours


def test_colouring_keeps_markdown_and_code_highlighting(view):
    text = "Use **this**:\n\n```python\nprint(1)\n```\n"
    spans = [
        ("Use ", "draft"),
        ("**this**", "target"),
        (":\n\n", "draft"),
        ("```python\n", "bonus"),
        ("print", "draft"),
        ("(1)\n```\n", "target"),
    ]
    view.set_messages([ViewMessage(1, "assistant", text, spans=spans)])
    view.set_coloured(True)
    browser = view.widgets[0].browser
    shown = browser.toPlainText()
    assert "```" not in shown and "**" not in shown and "print(1)" in shown
    document_html = browser.toHtml()
    assert "font-weight:700" in document_html or "font-weight:600" in document_html  # bold kept
    colours = PROVENANCE_COLOURS[False]
    cursor = QtGui.QTextCursor(browser.document())
    start = shown.index("print")
    cursor.setPosition(start + 1)
    assert cursor.charFormat().background().color().name() == colours["draft"][0]
    assert cursor.charFormat().foreground().color().name() != "#000000"  # Pygments' colour stays
    cursor.setPosition(shown.index("this") + 1)
    assert cursor.charFormat().background().color().name() == colours["target"][0]
    assert cursor.charFormat().fontWeight() >= 600


def test_source_positions_skip_markup_and_follow_the_text():
    assert source_positions("bold", "**bold**") == [2, 3, 4, 5]
    assert source_positions("a\nb", "a\n\n- b") == [0, 1, 5]
    assert source_positions("x", "") == [None]


def test_clicking_an_old_reply_asks_for_its_stats(view, qtbot):
    stats = {"generated_tokens": 7, "total_time_s": 1.0, "drafter": "ngram"}
    view.set_messages([ViewMessage(1, "user", "hi"), ViewMessage(2, "assistant", "hello there", stats=stats)])
    with qtbot.waitSignal(view.stats_requested, timeout=1000) as blocker:
        qtbot.mouseClick(view.widgets[1].browser.viewport(), Qt.MouseButton.LeftButton)
    assert blocker.args[0].id == 2 and blocker.args[0].stats == stats
    view.select_message(2)
    assert view.widgets[1].selected and not view.widgets[0].selected


def test_scroll_to_message_brings_it_into_view(view, qtbot):
    messages = [
        ViewMessage(i, "assistant", "\n\n".join(f"line {i}.{j}" for j in range(20))) for i in range(1, 16)
    ]
    view.set_messages(messages)
    bar = view.scroll.verticalScrollBar()
    # Every message is laid out at its full height (15 of about 550 px) and the view sits at the end.
    qtbot.waitUntil(lambda: bar.maximum() > 6000 and bar.value() == bar.maximum(), timeout=3000)
    qtbot.waitUntil(lambda: view.is_message_visible(15), timeout=2000)
    assert not view.is_message_visible(2)
    view.scroll_to_message(2)
    qtbot.waitUntil(lambda: view.is_message_visible(2), timeout=2000)
    qtbot.wait(50)
    assert view.is_message_visible(2) and not view.follow


def test_streaming_rerenders_at_most_about_fifteen_times_a_second(view, qtbot):
    view.set_messages([ViewMessage(1, "user", "hi"), ViewMessage(2, "assistant", "", status="streaming")])
    widget = view.streaming
    renders = []
    original = widget.render
    widget.render = lambda: (renders.append(1), original())
    for i in range(300):
        view.append_spans([(f"word{i} ", "target")])
        if i % 30 == 0:
            qtbot.wait(20)
    qtbot.wait(RENDER_INTERVAL_MS * 2)
    assert len(renders) <= 300 * 20 / RENDER_INTERVAL_MS + 3
    assert "word299" in widget.browser.toPlainText()
    view.finish_streaming(widget.message.text, "complete", {"generated_tokens": 300, "total_time_s": 24.0})
    assert "300 tokens" in widget.stats_label.text() and view.streaming is None
    assert widget.stats_label.toolTip() == "" or "<table>" in widget.stats_label.toolTip()


def test_auto_scroll_follows_unless_the_user_scrolled_up(view, qtbot):
    long_text = "\n\n".join(f"paragraph {i}" for i in range(60))
    view.set_messages(
        [ViewMessage(1, "assistant", long_text), ViewMessage(2, "assistant", "", status="streaming")]
    )
    bar = view.scroll.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=2000)

    bar.setValue(0)  # the user scrolls up
    assert not view.follow
    view.append_spans([("more\n\n" * 40, "target")])
    qtbot.wait(RENDER_INTERVAL_MS * 3)
    assert bar.value() == 0

    bar.setValue(bar.maximum())  # back to the bottom: following again
    view.append_spans([("even more\n\n" * 40, "target")])
    qtbot.waitUntil(lambda: bar.value() == bar.maximum() and view.follow, timeout=2000)


def test_stats_line_and_dark_palette(view):
    stats = {
        "generated_tokens": 10,
        "total_time_s": 0.5,
        "drafted": 8,
        "accepted": 4,
        "drafter": "ngram",
        "target_step_time_s": 0.075,
    }
    line = footer_line(stats)
    assert (
        line
        == "10 tokens · 20.0 tok/s · 50% accepted · ≈ ×1.50 vs target alone (faster, estimate) · n-gram lookup"
    )
    view.set_messages([ViewMessage(1, "assistant", "```python\nx = 1\n```")])
    palette = QtGui.QPalette()
    palette.setColor(QtGui.QPalette.ColorRole.Base, QtGui.QColor("#1e1e1e"))
    view.setPalette(palette)
    assert view.theme.dark and view.widgets[0].theme.dark
    assert "#272822" in view.widgets[0].browser.toHtml().lower()


def test_links_never_navigate_the_browser(view):
    view.set_messages([ViewMessage(1, "assistant", "see [docs](https://example.com)")])
    browser = view.widgets[0].browser
    assert not browser.openLinks() and not browser.openExternalLinks()
    assert isinstance(browser, QtWidgets.QTextBrowser)
