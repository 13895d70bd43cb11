"""The main window's menus and shortcuts. Every action is also reachable from the keyboard."""

from __future__ import annotations

from app.appearance import MODES
from app.qt import Qt, QtGui


def build_menus(window) -> None:
    """Create window.<name>_action attributes and the menu bar: Chat, Conversation, View, Help."""

    def action(
        text: str, shortcut: str | QtGui.QKeySequence.StandardKey | None, slot, tip: str = ""
    ) -> QtGui.QAction:
        act = QtGui.QAction(text, window)
        if shortcut is not None:
            act.setShortcut(QtGui.QKeySequence(shortcut))
            act.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        if tip:
            act.setStatusTip(tip)
        act.triggered.connect(slot)
        window.addAction(act)
        return act

    actions = window.conversation_actions
    window.new_action = action("New chat", "Ctrl+N", window.new_conversation)
    window.search_action = action("Search", "Ctrl+F", window.sidebar.focus_search)
    window.stop_action = action("Stop", "Esc", window.escape)
    window.settings_action = action("Settings…", "Ctrl+,", window.open_settings)
    window.models_action = action(
        "Models…", None, lambda: _open_models(window), "Installed models, downloads"
    )
    window.system_prompt_action = action(
        "System prompt…",
        "Ctrl+Shift+P",
        lambda: actions.edit_system_prompt(),
        "The instructions this conversation's model gets before your first message",
    )
    window.export_markdown_action = action(
        "Export as Markdown…", "Ctrl+E", lambda: actions.export_current("markdown")
    )
    window.export_json_action = action("Export as JSON…", None, lambda: actions.export_current("json"))
    window.export_all_action = action("Export all conversations…", None, lambda: actions.export("json", None))
    window.import_action = action(
        "Import conversations…",
        "Ctrl+I",
        actions.ask_import,
        "Import a Tandem .json export (or drop it on the window)",
    )
    window.help_action = action("Keyboard shortcuts and about…", "F1", window.show_help)

    chat = window.menuBar().addMenu("&Chat")
    for act in (window.new_action, window.search_action, window.stop_action, window.settings_action):
        chat.addAction(act)
    chat.addAction(window.models_action)
    chat.addSeparator()
    quit_action = chat.addAction("Quit")
    quit_action.setShortcut(QtGui.QKeySequence.StandardKey.Quit)
    quit_action.triggered.connect(window.request_close)

    conversation = window.menuBar().addMenu("C&onversation")
    conversation.addAction(window.system_prompt_action)
    conversation.addSeparator()
    for act in (window.export_markdown_action, window.export_json_action, window.export_all_action):
        conversation.addAction(act)
    conversation.addAction(window.import_action)

    view = window.menuBar().addMenu("&View")
    appearance = view.addMenu("Appearance")
    group = QtGui.QActionGroup(window)
    window.appearance_actions = {}
    for mode, label in MODES.items():
        act = appearance.addAction(label)
        act.setCheckable(True)
        act.triggered.connect(lambda _checked=False, mode=mode: window.set_appearance(mode))
        group.addAction(act)
        window.appearance_actions[mode] = act
    colour = view.addAction("Colour tokens by origin")
    colour.setCheckable(True)
    colour.toggled.connect(window.chat_view.set_coloured)
    window.chat_view.colouring_changed.connect(colour.setChecked)
    window.colour_action = colour
    side = view.addAction("Stats and sampling panel")
    side.setCheckable(True)
    side.setChecked(True)
    side.setShortcut(QtGui.QKeySequence("Ctrl+Shift+S"))
    side.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    side.toggled.connect(window.set_side_panel_visible)
    window.addAction(side)
    window.side_panel_action = side

    help_menu = window.menuBar().addMenu("&Help")
    help_menu.addAction(window.help_action)


def shortcut_actions(window) -> list[QtGui.QAction]:
    return [a for a in window.actions() if not a.shortcut().isEmpty()]


def _open_models(window):
    from app.model_manager import open_model_manager

    return open_model_manager(window)
