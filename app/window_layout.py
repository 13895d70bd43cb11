"""The main window's widgets and their wiring: the sidebar, the chat with its header and message box,
the side panel (stats and sampling) and the status bar. Laid out once, by MainWindow.__init__.
"""

from __future__ import annotations

from app.chat_header import ChatHeader
from app.chat_view import ChatView
from app.message_edit import MessageEdit
from app.qt import Qt, QtWidgets
from app.sampling_panel import SamplingPanel
from app.sidebar import Sidebar
from app.stats_panel import StatsPanel
from app.storage_guard import StorageBanner
from app.window_loading import optimize_label


def build_layout(window) -> None:
    """The widgets of the window, as `window.<name>` attributes, and how they are wired to it."""
    window.sidebar = Sidebar(window.store, window)
    window.header = ChatHeader(window)
    window.chat_view = ChatView(window)
    window.stats_panel = StatsPanel(window)
    window.sampling_panel = SamplingPanel(window.config, window)
    window.side_panel = QtWidgets.QTabWidget(window)
    window.side_panel.addTab(window.stats_panel, "Stats")
    window.side_panel.addTab(window.sampling_panel, "Sampling")

    center = QtWidgets.QWidget(window)
    center_layout = QtWidgets.QVBoxLayout(center)
    center_layout.setContentsMargins(0, 0, 0, 0)
    center_layout.addWidget(window.header)
    window.storage_banner = StorageBanner(center)
    window.storage_banner.retry_requested.connect(window.save_unsaved)
    center_layout.addWidget(window.storage_banner)
    center_layout.addWidget(window.chat_view, 1)
    window.edit_banner = QtWidgets.QLabel(center)
    window.edit_banner.setVisible(False)
    center_layout.addWidget(window.edit_banner)
    box = QtWidgets.QHBoxLayout()
    box.setContentsMargins(8, 4, 8, 8)
    window.message_edit = MessageEdit(center)
    window.message_edit.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line)")
    window.message_edit.setMaximumHeight(84)
    window.message_edit.submitted.connect(window.send)
    box.addWidget(window.message_edit, 1)
    window.send_button = QtWidgets.QPushButton("Send", center)
    window.send_button.clicked.connect(window.send_or_stop)
    box.addWidget(window.send_button, 0, Qt.AlignmentFlag.AlignBottom)
    center_layout.addLayout(box)

    window.splitter = QtWidgets.QSplitter(Qt.Orientation.Horizontal, window)
    for index, widget in enumerate((window.sidebar, center, window.side_panel)):
        window.splitter.addWidget(widget)
        window.splitter.setStretchFactor(index, 1 if widget is center else 0)
    window.splitter.setCollapsible(1, False)
    window.splitter.setSizes([240, 640, window.side_panel.sizeHint().width()])
    window.setCentralWidget(window.splitter)
    window.resize(1280, 800)

    window.models_label = QtWidgets.QLabel("No model loaded", window)
    window.activity_label = QtWidgets.QLabel("", window)
    window.optimize_label = optimize_label(window)  # the engine's background optimization
    window.statusBar().addWidget(window.models_label, 1)
    window.statusBar().addPermanentWidget(window.optimize_label)
    window.statusBar().addPermanentWidget(window.activity_label)

    window.sidebar.conversation_selected.connect(window.open_conversation)
    window.sidebar.message_selected.connect(window.open_search_hit)
    window.sidebar.new_requested.connect(window.new_conversation)
    window.sidebar.conversation_deleted.connect(window.on_conversation_deleted)
    window.sidebar.menu_requested.connect(window.conversation_actions.show_conversation_menu)
    window.sidebar.storage_failed.connect(window.storage_banner.show_error)
    window.header.model_chosen.connect(lambda spec: window.loading.switch_target(spec))
    window.header.prompt_clicked.connect(lambda: window.conversation_actions.edit_system_prompt())
    window.header.side_panel_toggled.connect(window.set_side_panel_visible)
    window.sampling_panel.changed.connect(window.apply_config)
    window.chat_view.regenerate_requested.connect(window.regenerate)
    window.chat_view.answer_requested.connect(window.answer)
    window.chat_view.edit_requested.connect(lambda message_id: window.editor.start(message_id))
    window.chat_view.branch_requested.connect(window.switch_branch)
    window.chat_view.stats_requested.connect(window.show_message_stats)
    # a reply clicked for its figures brings the stats forward in the side panel
    window.chat_view.stats_requested.connect(
        lambda _message: window.side_panel.setCurrentWidget(window.stats_panel)
    )
    window.chat_view.reply_in_view.connect(
        lambda message: window.show_message_stats(message, "The reply in view")
    )
    window.chat_view.copied.connect(lambda: window.statusBar().showMessage("Copied to the clipboard.", 2500))
