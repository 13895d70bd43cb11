"""Crash reports: uncaught Python exceptions and fatal signals go to log files in the data folder.

A report left by the previous run is read at the next start and shown once, then set aside.
"""

from __future__ import annotations

import faulthandler
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path

EXCEPTIONS_LOG = "crash.log"
FATAL_LOG = "crash-fatal.log"  # faulthandler's output: segfaults, aborts, deadlocked exits

_fatal_file = None  # kept open for faulthandler, which writes from a signal handler


def install(log_dir: Path) -> None:
    global _fatal_file
    log_dir.mkdir(parents=True, exist_ok=True)
    _fatal_file = open(log_dir / FATAL_LOG, "a", encoding="utf-8")  # noqa: SIM115 - open for the process's life
    faulthandler.enable(file=_fatal_file, all_threads=True)
    previous = sys.excepthook

    def hook(kind, value, tb):
        try:
            with open(log_dir / EXCEPTIONS_LOG, "a", encoding="utf-8") as log:
                stamp = datetime.now(UTC).isoformat(timespec="seconds")
                log.write(f"--- {stamp}\n{''.join(traceback.format_exception(kind, value, tb))}\n")
        finally:
            previous(kind, value, tb)

    sys.excepthook = hook


def take_report(log_dir: Path) -> str | None:
    """The previous run's crash report, if it left one; the logs are renamed so it is shown once."""
    parts = []
    for name in (FATAL_LOG, EXCEPTIONS_LOG):
        path = log_dir / name
        try:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            continue
        if text:
            parts.append(text)
            path.replace(path.with_name(name + ".old"))
    return "\n\n".join(parts) or None
