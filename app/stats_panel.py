"""Live speculative-decoding statistics: numbers for the current round and two small plots.

The plots use pyqtgraph rather than QtCharts. QtCharts ships only in the full PySide6 wheel
(about 430 MB more than PySide6-Essentials), while pyqtgraph is pure Python drawing on ordinary
Qt widgets, and it updates a curve in place with `setData`, which is what a plot refreshed many
times a second needs. Redraws are still throttled to about 10 Hz: the engine reports every round,
which can be far more often than a human can read a plot.
"""

from __future__ import annotations

import time
from dataclasses import fields

import pyqtgraph as pg

from app.qt import QTimer, QtWidgets
from engine.stats import GenerationStats

PLOT_INTERVAL_S = 0.1
FALLBACK_TEXT = "Speculation slower than target — using plain decoding"
DASH = "—"

# (key, label) in display order
FIELDS = (
    ("drafter", "Drafter"),
    ("k", "Current K"),
    ("acceptance", "Acceptance rate"),
    ("mean_accepted", "Mean accepted length"),
    ("tokens_per_s", "Tokens/s"),
    ("ttft", "Time to first token"),
    ("time_split", "Draft / verify time"),
    ("speedup", "Speed-up vs target alone"),
)


class StatsPanel(QtWidgets.QWidget):
    """Call update_stats() with a GenerationStats snapshot after every round; the caller must not
    mutate that object afterwards, since the throttled plot redraw reads it later."""

    def __init__(self, parent: QtWidgets.QWidget | None = None, plot_interval_s: float = PLOT_INTERVAL_S):
        super().__init__(parent)
        self._plot_interval_s = plot_interval_s
        self._stats: GenerationStats | None = None
        self._last_plot_at = float("-inf")
        self.plot_redraws = 0  # how many times the plots were redrawn; the throttle is tested on it

        self._plot_timer = QTimer(self)
        self._plot_timer.setSingleShot(True)
        self._plot_timer.timeout.connect(self._redraw_plots)

        self._values: dict[str, QtWidgets.QLabel] = {}
        form = QtWidgets.QFormLayout()
        for key, label in FIELDS:
            value = QtWidgets.QLabel(DASH)
            self._values[key] = value
            form.addRow(label + ":", value)
        self._note = QtWidgets.QLabel()
        self._note.setWordWrap(True)
        self._note.setVisible(False)

        self._lengths_plot = pg.PlotWidget()
        self._lengths_plot.setTitle("Tokens per round")
        self._lengths_plot.setLabel("bottom", "round")
        self._lengths_plot.setMouseEnabled(x=False, y=False)
        self._lengths_plot.addLegend(offset=(-5, 5))
        self._lengths_curve = self._lengths_plot.plot([], [], pen=pg.mkPen("c", width=2), name="accepted + 1")
        self._k_curve = self._lengths_plot.plot(
            [], [], pen=pg.mkPen("y", width=1, style=pg.QtCore.Qt.PenStyle.DashLine), name="K"
        )

        self._position_plot = pg.PlotWidget()
        self._position_plot.setTitle("Acceptance by draft position")
        self._position_plot.setLabel("bottom", "position")
        self._position_plot.setMouseEnabled(x=False, y=False)
        self._position_plot.setYRange(0, 1)
        self._position_bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush="c")
        self._position_plot.addItem(self._position_bars)

        for plot in (self._lengths_plot, self._position_plot):
            plot.setMinimumHeight(120)
            plot.hideButtons()

        layout = QtWidgets.QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self._note)
        layout.addWidget(self._lengths_plot, 1)
        layout.addWidget(self._position_plot, 1)

    # --- public API ------------------------------------------------------------------------------

    def update_stats(self, stats: GenerationStats) -> None:
        self._stats = stats
        self._show_numbers(stats)
        self._request_plot()

    def show_saved(self, stats_dict: dict | None) -> None:
        """Show a stored message's stats (GenerationStats.to_dict() output), plots included, at once."""
        self.reset()
        if not stats_dict:
            return
        stats = stats_from_dict(stats_dict)
        self._stats = stats
        self._show_numbers(stats)
        self._redraw_plots()

    def reset(self) -> None:
        self._plot_timer.stop()
        self._stats = None
        for value in self._values.values():
            value.setText(DASH)
        self._note.clear()
        self._note.setVisible(False)
        self._lengths_curve.setData([], [])
        self._k_curve.setData([], [])
        self._position_bars.setOpts(x=[], height=[])

    def value_text(self, key: str) -> str:
        """The text shown for one of FIELDS' keys."""
        return self._values[key].text()

    def note_text(self) -> str:
        return self._note.text() if self._note.isVisibleTo(self) else ""

    def plotted_lengths(self) -> list[float]:
        _, y = self._lengths_curve.getData()
        return [] if y is None else [float(v) for v in y]

    def plotted_position_acceptance(self) -> list[float]:
        heights = self._position_bars.opts.get("height")
        return [] if heights is None else [float(v) for v in heights]

    # --- drawing ---------------------------------------------------------------------------------

    def _show_numbers(self, stats: GenerationStats) -> None:
        for key, text in format_stats(stats).items():
            self._values[key].setText(text)
        note = note_for(stats)
        self._note.setText(note)
        self._note.setVisible(bool(note))

    def _request_plot(self) -> None:
        if self._plot_timer.isActive():
            return
        wait = self._plot_interval_s - (time.monotonic() - self._last_plot_at)
        if wait <= 0:
            self._redraw_plots()
        else:
            self._plot_timer.start(max(1, round(wait * 1000)))

    def _redraw_plots(self) -> None:
        self._last_plot_at = time.monotonic()
        stats = self._stats
        if stats is None:
            return
        self.plot_redraws += 1
        lengths = list(stats.accepted_lengths)
        rounds = list(range(1, len(lengths) + 1))
        self._lengths_curve.setData(rounds, lengths)
        k_history = list(stats.k_history)
        self._k_curve.setData(list(range(1, len(k_history) + 1)), k_history)
        acceptance = stats.per_position_acceptance()
        self._position_bars.setOpts(x=list(range(1, len(acceptance) + 1)), height=acceptance)


def stats_from_dict(data: dict) -> GenerationStats:
    """A GenerationStats from its to_dict() output; derived and unknown keys are ignored."""
    names = {f.name for f in fields(GenerationStats)}
    return GenerationStats(**{k: v for k, v in data.items() if k in names})


def format_stats(stats: GenerationStats) -> dict[str, str]:
    speculating = stats.drafter != "none" and not stats.fallback_to_plain
    return {
        "drafter": describe_drafter(stats.drafter),
        "k": f"{stats.current_k} ({stats.k_mode})" if speculating else DASH,
        "acceptance": _acceptance(stats),
        "mean_accepted": _number(stats.mean_accepted_length, "{:.2f} tokens/round"),
        "tokens_per_s": _number(stats.tokens_per_s, "{:.1f}"),
        "ttft": _number(stats.ttft_s, "{:.2f} s"),
        "time_split": _time_split(stats),
        "speedup": _speedup(stats.speedup),
    }


def note_for(stats: GenerationStats) -> str:
    parts = [FALLBACK_TEXT] if stats.fallback_to_plain else []
    if stats.note:
        parts.append(stats.note)
    return "\n".join(parts)


def describe_drafter(drafter: str) -> str:
    if drafter.startswith("model:"):
        return "draft model " + drafter.removeprefix("model:")
    return {"ngram": "n-gram lookup", "none": "none (target alone)"}.get(drafter, drafter)


def _acceptance(stats: GenerationStats) -> str:
    rate = stats.acceptance_rate
    if rate is None:
        return DASH
    return f"{rate:.0%} ({stats.accepted} of {stats.drafted} drafted)"


def _time_split(stats: GenerationStats) -> str:
    total = stats.draft_time_s + stats.verify_time_s
    if total <= 0:
        return DASH
    share = stats.draft_time_s / total
    return f"{stats.draft_time_s:.2f} s / {stats.verify_time_s:.2f} s ({share:.0%} drafting)"


def _speedup(speedup: float | None) -> str:
    if speedup is None:
        return "not measured yet"
    verdict = "faster" if speedup >= 1 else "slower"
    return f"×{speedup:.2f} ({verdict}, measured)"


def _number(value: float | None, template: str) -> str:
    return DASH if value is None else template.format(value)
