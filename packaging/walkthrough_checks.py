"""What the walkthrough measures and checks besides its steps: a fresh cache and config, a busy machine,
the times a user waits, and whether any two figures the window shows for the same thing disagree.

Used by packaging/walkthrough.py; no Qt imports here beyond what the figures are read from.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _process_started() -> float:
    """When this process started, on the monotonic clock: "time to window" counts from the launch, the
    interpreter's and Qt's imports included (Linux's /proc; elsewhere from this module's import)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.monotonic() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic()


STARTED = _process_started()


def fresh_environment() -> tempfile.TemporaryDirectory:
    """Point Tandem's cache, data and config (native kernels, converted models, calibration, compiled
    paths included) at an empty folder, as on a first start; the folder goes when the walk ends."""
    folder = tempfile.TemporaryDirectory(prefix="tandem-fresh-")
    for name in ("CACHE", "DATA", "CONFIG"):
        path = Path(folder.name) / name.lower()
        path.mkdir()
        os.environ[f"TANDEM_{name}_DIR"] = str(path)
    os.environ.pop("TANDEM_NATIVE_DIR", None)  # built into the fresh cache, as a new user's would be
    return folder


def start_cpu_hogs(count: int | None = None) -> list[subprocess.Popen]:
    """One busy loop per core at normal priority: the browser and the build running beside Tandem."""
    count = count or os.cpu_count() or 1
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def stop_cpu_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.terminate()
    for hog in hogs:
        hog.wait(timeout=10)


class Timeline:
    """Seconds from the walkthrough's start to each moment a user waits for; each marked once."""

    def __init__(self):
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        if name not in self.marks:
            self.marks[name] = round(time.monotonic() - STARTED, 1)
            print(f"time: {name} at {self.marks[name]} s", flush=True)

    def since(self, start: str, end: str) -> float | None:
        if start in self.marks and end in self.marks:
            return round(self.marks[end] - self.marks[start], 2)
        return None


# --- the figures a reply shows, and whether they agree ------------------------------------------------

SPEEDUP = r"×(\d+\.\d+) \((faster|about the same|slower), (estimate|measured in this reply)\)"


def figures_of(window, widget) -> dict:
    """Every figure the stats panel and the footer show for one reply, with what the store keeps."""
    from app.stats_format import FIELDS

    panel = window.stats_panel
    stats = dict(widget.message.stats or {})
    return {
        "message_id": widget.message.id,
        "status": widget.message.status,
        "panel_caption": re.sub("<[^>]+>", "", panel.caption_text()),
        "panel": {key: panel.value_text(key) for key, _ in FIELDS},
        "panel_note": panel.note_text(),
        "footer": widget.stats_label.text(),
        "context_meter": window.header.context_text(),
        "stored": {
            key: stats.get(key)
            for key in (
                "drafter",
                "generated_tokens",
                "prompt_tokens",
                "drafted",
                "accepted",
                "rounds",
                "plain_steps",
                "speedup",
                "speedup_is_estimate",
                "verdict",
                "decode_tokens_per_s",
                "fallback_to_plain",
                "provenance_counts",
            )
        },
    }


def disagreements(figures: dict) -> list[str]:
    """Where two figures for the same thing differ (an empty list: they agree)."""
    panel, footer, stored = figures["panel"], figures["footer"], figures["stored"]
    found = []
    speed = panel["tokens_per_s"]
    if speed.endswith("tok/s") and speed not in footer:
        found.append(f"decode speed: panel {speed!r}, footer {footer!r}")
    accepted = panel["acceptance"].split(" ")[0]
    if accepted.endswith("%") and f"{accepted} accepted" not in footer:
        found.append(f"acceptance: panel {accepted!r}, footer {footer!r}")
    figure = re.search(SPEEDUP, panel["speedup"])
    if figure and f"×{figure[1]} vs target alone ({figure[2]}, {figure[3]})" not in footer:
        found.append(f"speed-up: panel {panel['speedup']!r}, footer {footer!r}")
    if "×" in footer and not figure:
        found.append(f"speed-up: the footer claims one, the panel says {panel['speedup']!r}")
    plain_claim = "decoded plainly" in figures["panel_note"] or "decoded plainly" in footer
    if plain_claim and "decoded plainly" not in panel["speedup"]:
        found.append(
            f"plain decoding said beside a speed-up: {panel['speedup']!r} / {figures['panel_note']!r}"
        )
    generated = stored.get("generated_tokens")
    if generated and f"{generated} tokens" not in footer:
        found.append(f"tokens: stored {generated}, footer {footer!r}")
    counts = stored.get("provenance_counts") or {}
    if counts and stored.get("accepted") is not None and counts.get("draft") != stored["accepted"]:
        found.append(f"accepted: colouring {counts.get('draft')}, stats {stored['accepted']}")
    if counts and generated is not None and sum(counts.values()) != generated:
        found.append(f"tokens: colouring {sum(counts.values())}, stats {generated}")
    return found


def context_disagreements(window) -> list[str]:
    """The context figure: the chat's meter and Settings' memory line must name the same one."""
    from engine.models import probes

    limit = window.bridge.info.context_length if window.bridge.info else None
    line = probes.memory_line(window.config.target, None)
    if limit and f"at {limit:,} tokens of context" not in line:
        return [f"context: the meter says {limit:,} tokens, Settings says {line!r}"]
    return []


def export_disagreements(markdown: str, figures: list[dict]) -> list[str]:
    """Each speed-up and decode speed the Markdown export states is one a reply showed, same basis."""
    shown_speedups = set()
    for entry in figures:
        figure = re.search(SPEEDUP, entry["panel"]["speedup"])
        if figure:
            shown_speedups.add((figure[1], figure[3]))
    shown_speeds = {entry["panel"]["tokens_per_s"].removesuffix(" tok/s") for entry in figures}
    found = []
    for number, basis in re.findall(
        r"(\d+\.\d+)× speed-up vs the target alone \((estimate|measured in this reply)\)", markdown
    ):
        if (number, basis) not in shown_speedups:
            found.append(f"export: '{number}× ({basis})' was not shown for any reply")
    for speed in re.findall(r"(\d+\.\d) tokens/s", markdown):
        if speed not in shown_speeds:
            found.append(f"export: '{speed} tokens/s' was not shown for any reply")
    return found


def write_report(
    path: Path, timeline: Timeline, figures: list[dict], problems: list[str], extra: dict
) -> None:
    report = {"times_s": timeline.marks, **extra, "figures": figures, "disagreements": problems}
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {path}", flush=True)
