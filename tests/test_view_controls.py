"""The app's chat view shows a reply's control characters (escape sequences, carriage returns, C1
controls) as symbols in its rendered text, in the reply, its code blocks and its error, never as raw
controls in the document."""

from __future__ import annotations

import unicodedata

import pytest
from fake_openai_server import HOSTILE, HOSTILE_ERROR

from app.chat_view import ChatView, ViewMessage

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


def raw_controls(text: str) -> list[str]:
    return [repr(c) for c in text if unicodedata.category(c) == "Cc" and c not in "\n\t"]


def test_the_view_shows_control_characters_as_symbols(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    reply = "".join(HOSTILE)
    view.set_messages(
        [
            ViewMessage(1, "assistant", reply + "\n\n```sh\necho \x1b]52;c;eA==\x07\n```\n"),
            ViewMessage(2, "assistant", "partly", status="error", stats={"error": HOSTILE_ERROR}),
        ]
    )
    for widget in view.widgets:
        html, shown = widget.browser.toHtml(), widget.browser.toPlainText()
        assert raw_controls(html) == [] and raw_controls(shown) == [], shown
    first, second = (widget.browser.toPlainText() for widget in view.widgets)
    assert "␛]52;c;ZWNobyBvd25lZA==␇" in first and "echo ␛]52;c;eA==␇" in first
    assert "␛]52;c;ZXZpbA==␇" in second and "<9B>2J" in second
