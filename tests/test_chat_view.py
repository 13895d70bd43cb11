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
    format_stats_line,
    render_markdown,
)
from app.qt import QtGui, QtWidgets

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
    widget.copy_button.click()
    assert QtGui.QGuiApplication.clipboard().text().startswith("Try:")


def test_provenance_runs_round_trip():
    spans = [("Hel", "draft"), ("lo", "draft"), (",", "target"), (" world", "bonus")]
    runs = encode_provenance(spans)
    assert runs == [[5, "d"], [1, "t"], [6, "b"]]
    assert decode_provenance("Hello, world!", runs) == [("Hello", "draft"), (",", "target"), (" world", "bonus"), ("!", "")]


def test_colouring_toggle_shows_legend_counts_and_coloured_spans(view):
    spans = [("a", "draft"), ("b", "draft"), ("c", "target"), ("d", "bonus")]
    view.set_messages([ViewMessage(1, "assistant", "abcd", spans=list(spans))])
    assert not view.legend.isVisibleTo(view)
    view.colour_toggle.setChecked(True)
    assert view.legend.isVisibleTo(view)
    assert view.provenance_counts() == {"draft": 2, "target": 1, "bonus": 1}
    assert view.legend.labels["draft"].text().endswith("draft accepted&nbsp;</span> 2")
    html = view.widgets[0].browser.toHtml()
    assert html.count("background-color:") >= 3
    view.colour_toggle.setChecked(False)
    assert "background-color:#c6efce" not in view.widgets[0].browser.toHtml()


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
    view.finish_streaming(widget.message.text, "complete", {"generated_tokens": 300, "tokens_per_s": 12.5})
    assert "300 tokens" in widget.stats_label.text() and view.streaming is None
    assert widget.stats_label.toolTip() == "" or "<table>" in widget.stats_label.toolTip()


def test_auto_scroll_follows_unless_the_user_scrolled_up(view, qtbot):
    long_text = "\n\n".join(f"paragraph {i}" for i in range(60))
    view.set_messages([ViewMessage(1, "assistant", long_text), ViewMessage(2, "assistant", "", status="streaming")])
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
    line = format_stats_line(
        {"generated_tokens": 10, "decode_tokens_per_s": 20.0, "acceptance_rate": 0.5, "speedup": 1.5, "drafter": "ngram"}
    )
    assert line == "10 tokens · 20.0 tok/s · 50% accepted · 1.50× vs target alone · drafter ngram"
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
