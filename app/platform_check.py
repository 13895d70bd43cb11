"""Before the window opens on X11: can Qt's xcb platform plugin load? If not, the one apt-get line.

Qt's own message when its xcb plugin fails names `libxcb-cursor0` whatever is missing (on a stock
Debian it was `libxcb-icccm4` and `libxcb-keysyms1`), then aborts. This asks `ldd` which libraries the
plugin (`libqxcb.so` in PySide6) cannot find and names their Debian packages. No Qt import, no torch:
`make run` calls it first (`python -m app.platform_check`), and app.main before QApplication.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)
SONAME = re.compile(r"^(lib[\w+.-]*?)\.so\.(\d+)")
# where a package's name is not the library's name and major version (Debian's usual rule)
PACKAGES = {"libGL.so.1": "libgl1", "libEGL.so.1": "libegl1", "libOpenGL.so.0": "libopengl0"}


def xcb_plugin() -> Path | None:
    """PySide6's xcb platform plugin, where PySide6 is installed (a bundle keeps it under _internal)."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        plugin = Path(folder) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
        if plugin.is_file():
            return plugin
    return None


def missing_libraries(ldd_output: str) -> list[str]:
    """The libraries `ldd` reports "not found", each once, in order."""
    return list(dict.fromkeys(NOT_FOUND.findall(ldd_output)))


def package_of(library: str) -> str:
    """The Debian package that ships a library: libxcb-icccm.so.4 -> libxcb-icccm4, and a name that
    ends in a digit takes a hyphen (libxkbcommon-x11.so.0 -> libxkbcommon-x11-0)."""
    if library in PACKAGES:
        return PACKAGES[library]
    match = SONAME.match(library)
    if match is None:
        return library
    name, major = match.group(1).lower(), match.group(2)
    return f"{name}-{major}" if name[-1].isdigit() else f"{name}{major}"


def install_line(libraries: list[str]) -> str:
    packages = sorted(dict.fromkeys(package_of(library) for library in libraries))
    return "sudo apt-get install " + " ".join(packages)


def uses_xcb(environ=os.environ) -> bool:
    """Whether Qt will pick its xcb plugin: on Linux, with an X display, unless another is asked for.
    Not in the bundle: its libraries sit beside it, where ldd on the plugin alone does not look, and
    the .deb declares the system's (packaging/deb/control.in)."""
    if not sys.platform.startswith("linux") or getattr(sys, "frozen", False):
        return False
    asked = environ.get("QT_QPA_PLATFORM", "")
    if asked:
        return asked.split(":")[0] == "xcb"
    return bool(environ.get("DISPLAY")) and not environ.get("WAYLAND_DISPLAY")


def problem(plugin: Path | None = None) -> str | None:
    """What to tell the user when the xcb plugin cannot load, or None (it can, or it cannot be told)."""
    plugin = plugin or xcb_plugin()
    ldd = shutil.which("ldd")
    if plugin is None or ldd is None:
        return None
    try:
        output = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    missing = missing_libraries(output)
    if not missing:
        return None
    return (
        "tandem: the window cannot open: Qt's X11 (xcb) platform plugin needs libraries this system "
        f"lacks ({', '.join(missing)}). Install them with:\n\n    {install_line(missing)}\n\n"
        "(or chat in the terminal with: tandem-cli chat)"
    )


def main() -> int:
    found = problem() if uses_xcb() else None
    if found:
        print(found, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
