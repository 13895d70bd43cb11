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


def test_the_status_bar_names_no_draft_model_where_none_loaded():
    """Seen: "automatic (draft model auto among them); last reply: head" where auto loaded no draft model
    (EngineInfo.draft then names the drafter) and the draft head drafted."""
    from app.bridge import EngineInfo
    from app.window_loading import models_text

    info = EngineInfo(target="smollm2", draft="auto", device="cpu", quantization="none")
    text = models_text(info, AppConfig(drafter="auto"), in_use="draft head")
    assert "Drafter: automatic; last reply: draft head" in text and "draft model auto" not in text
    with_model = EngineInfo(target="smollm2", draft="tiny", device="cpu", quantization="none")
    assert "(draft model tiny among them)" in models_text(with_model, AppConfig(drafter="auto"))


def test_enter_in_the_search_box_opens_the_first_hit(qtbot, store):
    first = store.create_conversation("Cooking")
    store.add_message(first, "user", "How long do I boil an egg?")
    second = store.create_conversation("Decoding")
    store.add_message(second, "user", "Explain speculative decoding")
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    window.sidebar.select(second)
    qtbot.keyClicks(window.sidebar.search_box, "egg")
    qtbot.keyClick(window.sidebar.search_box, Qt.Key.Key_Return)  # before the search's typing delay
    assert window.conversation_id == first
    assert any("boil an egg" in w.message.text for w in window.chat_view.widgets)


def test_a_file_imported_twice_is_not_duplicated_and_says_so(qtbot, store, tmp_path):
    from engine.store.export import export_json

    kept = store.create_conversation("Recipes")
    store.add_message(kept, "user", "Bread?")
    exported = tmp_path / "recipes.json"
    export_json(store, exported)
    store.delete_conversation(kept)
    store.purge_deleted()
    window = open_window(qtbot, store, ScriptedEngine(["ok"]))
    assert len(window.conversation_actions.import_files([exported])) == 1
    assert window.conversation_actions.import_files([exported]) == []
    assert [c.title for c in store.list_conversations()] == ["Recipes"]
    assert "Already here, not imported again: “Recipes”" in window.statusBar().currentMessage()
    store.add_message(store.list_conversations()[0].id, "user", "And cake?")  # no longer the same
    assert len(window.conversation_actions.import_files([exported])) == 1
