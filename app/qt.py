"""The one place the app imports Qt from, so a binding change touches a single file."""

from PySide6 import QtCore, QtGui, QtWidgets
from PySide6.QtCore import QObject, Qt, QThread, QTimer, Signal, Slot

__all__ = ["QtCore", "QtGui", "QtWidgets", "Qt", "QObject", "QThread", "QTimer", "Signal", "Slot"]
