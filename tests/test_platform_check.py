"""`make run` and the app check that Qt's xcb plugin can load, and name the packages to install."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from app import platform_check
from app.qt import QtCore, QtWidgets

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")
LDD_OF_A_STOCK_DEBIAN = """\
\tlibQt6XcbQpa.so.6 => /opt/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007f469a7ea000)
\tlibxkbcommon-x11.so.0 => not found
\tlibxcb-cursor.so.0 => /lib/x86_64-linux-gnu/libxcb-cursor.so.0 (0x00007f4699bee000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-icccm.so.4 => not found
\tlibEGL.so.1 => not found
"""


def test_missing_libraries_become_one_apt_get_line():
    missing = platform_check.missing_libraries(LDD_OF_A_STOCK_DEBIAN)
    assert missing == ["libxkbcommon-x11.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libEGL.so.1"]
    assert platform_check.install_line(missing) == (
        "sudo apt-get install libegl1 libxcb-icccm4 libxcb-keysyms1 libxkbcommon-x11-0"
    )


def test_qt_picks_xcb_only_with_an_x_display_and_no_other_platform_asked_for():
    assert platform_check.uses_xcb({"DISPLAY": ":0"})
    assert platform_check.uses_xcb({"QT_QPA_PLATFORM": "xcb"})
    assert not platform_check.uses_xcb({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"})
    assert not platform_check.uses_xcb({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"})
    assert not platform_check.uses_xcb({})


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("ldd") is None, reason="needs cc and ldd")
def test_a_plugin_whose_library_is_gone_is_reported_with_its_package(tmp_path):
    """A real shared object that needs a library which is not there, as the xcb plugin needs
    libxcb-icccm.so.4 on a stock Debian: ldd finds it missing and its package is named."""
    (tmp_path / "gone.c").write_text("int gone(void) { return 1; }\n")
    (tmp_path / "plugin.c").write_text("int gone(void);\nint plugin(void) { return gone(); }\n")
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libxcb-tandemtest.so.4",
            "-o",
            str(tmp_path / "libxcb-tandemtest.so"),
            str(tmp_path / "gone.c"),
        ],
        check=True,
    )
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-o",
            str(tmp_path / "libqxcb.so"),
            str(tmp_path / "plugin.c"),
            "-Wl,--no-as-needed",
            f"-L{tmp_path}",
            "-lxcb-tandemtest",
        ],
        check=True,
    )
    (tmp_path / "libxcb-tandemtest.so").unlink()
    found = platform_check.problem(tmp_path / "libqxcb.so")
    assert found is not None and "sudo apt-get install libxcb-tandemtest4" in found


def test_the_installed_plugin_is_found_and_checked():
    plugin = platform_check.xcb_plugin()
    assert plugin is not None and plugin.name == "libqxcb.so"
    found = platform_check.problem(plugin)
    assert found is None or "sudo apt-get install lib" in found


def test_the_crash_notice_is_painted_before_the_load_starts(qtbot, tmp_path):
    """It showed black for the whole load: shown after the load had started, its first paint waited."""
    from app.main import show_crash_notice

    window = QtWidgets.QWidget()
    qtbot.addWidget(window)
    window.show()
    paints = []

    class Counter(QtCore.QObject):
        def eventFilter(self, watched, event):  # noqa: N802
            if event.type() == QtCore.QEvent.Type.Paint:
                paints.append(watched)
            return False

    counter = Counter()
    QtWidgets.QApplication.instance().installEventFilter(counter)
    try:
        box = show_crash_notice(window, "Fatal Python error: Segmentation fault", tmp_path)
    finally:
        QtWidgets.QApplication.instance().removeEventFilter(counter)
    assert box.isVisible() and str(tmp_path) in box.text()
    assert box in paints  # painted before returning, with no event loop running
    box.close()
