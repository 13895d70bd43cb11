"""The window's smaller promises: the status bar names the drafter in use, search opens its first hit on
Enter, a file imported twice is not duplicated."""

from __future__ import annotations

import pytest
from test_app import ScriptedEngine, open_window, send

from app.config import AppConfig
from app.qt import Qt

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


def test_the_status_bar_names_the_drafter_as_it_changes(qtbot, store):
    """Seen: "Draft: auto" in the status bar whatever the drafter was set to since."""
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    assert "Drafter: automatic" in window.models_label.text()
    window.apply_config(AppConfig(drafter="ngram", auto_titles=False))
    assert "Drafter: n-gram lookup" in window.models_label.text()
    window.apply_config(AppConfig(drafter="none", auto_titles=False))
    assert "Drafter: none (target alone)" in window.models_label.text()
    window.apply_config(AppConfig(drafter="auto", auto_titles=False))
    send(qtbot, window, "hi")  # the scripted reply drafts with its model
    assert "Drafter: automatic" in window.models_label.text()
    assert "last reply: draft model scripted" in window.models_label.text()
