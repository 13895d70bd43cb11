"""Light, dark, or following the system: the application palette, which every widget and chart reads."""

from __future__ import annotations

from app.qt import Qt, QtGui, QtWidgets

MODES = {"system": "Follow the system", "light": "Light", "dark": "Dark"}


def dark_palette() -> QtGui.QPalette:
    role, group = QtGui.QPalette.ColorRole, QtGui.QPalette.ColorGroup
    colours = {
        role.Window: "#2b2d30",
        role.WindowText: "#e6e6e6",
        role.Base: "#1e1f22",
        role.AlternateBase: "#2f3136",
        role.ToolTipBase: "#2f3136",
        role.ToolTipText: "#e6e6e6",
        role.Text: "#e6e6e6",
        role.PlaceholderText: "#8c8f94",
        role.Button: "#35373b",
        role.ButtonText: "#e6e6e6",
        role.BrightText: "#ff6b6b",
        role.Highlight: "#3d7bd9",
        role.HighlightedText: "#ffffff",
        role.Link: "#7aa7ff",
        role.LinkVisited: "#b494ff",
        role.Mid: "#4a4d52",
        role.Dark: "#18191b",
        role.Light: "#45484d",
        role.Shadow: "#0c0c0d",
    }
    palette = QtGui.QPalette()
    for colour_role, colour in colours.items():
        palette.setColor(colour_role, QtGui.QColor(colour))
    for colour_role in (role.Text, role.WindowText, role.ButtonText):
        palette.setColor(group.Disabled, colour_role, QtGui.QColor("#7a7d82"))
    return palette


def light_palette() -> QtGui.QPalette:
    palette = QtWidgets.QApplication.style().standardPalette()
    palette.setColor(QtGui.QPalette.ColorRole.Highlight, QtGui.QColor("#2f6fd0"))
    return palette


def system_palette() -> QtGui.QPalette:
    hints = QtGui.QGuiApplication.styleHints()
    if hasattr(hints, "colorScheme") and hints.colorScheme() == Qt.ColorScheme.Dark:
        return dark_palette()
    return light_palette()


def apply_appearance(mode: str) -> str:
    """Set the application palette for `mode` (system, light or dark); returns the mode applied."""
    mode = mode if mode in MODES else "system"
    palette = {"dark": dark_palette, "light": light_palette}.get(mode, system_palette)()
    QtWidgets.QApplication.setPalette(palette)
    return mode


def is_dark(widget: QtWidgets.QWidget) -> bool:
    return widget.palette().color(QtGui.QPalette.ColorRole.Base).lightness() < 128
