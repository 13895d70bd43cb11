"""Speculative-decoding statistics of one reply: its numbers and two small charts.

The numbers and their wording come from app/stats_format.py, the same source as the footer under each
reply. The panel shows the reply being written (update_stats) or a stored one (show_saved: clicking
an old reply brings its numbers and charts back).

The plots use pyqtgraph rather than QtCharts. QtCharts ships only in the full PySide6 wheel
(about 430 MB more than PySide6-Essentials), while pyqtgraph is pure Python drawing on ordinary
Qt widgets, and it updates a curve in place with `setData`, which is what a plot refreshed many
times a second needs. Redraws are still throttled to about 10 Hz: the engine reports every round,
which can be far more often than a human can read a plot.

Charts follow the window's palette, their axes have whole-number ticks that never go below zero, and
the panel keeps one width, so long notes wrap instead of squeezing the chat.
"""

from __future__ import annotations

import html
import math
import time

import pyqtgraph as pg

from app.qt import QtCore, QtGui, QTimer, QtWidgets
from app.stats_format import (
    DASH,
    FIELDS,
    SPEEDUP_TOOLTIP,
    empty_stats,
    format_stats,
    notice,
    stats_from_dict,
)
from engine.stats import GenerationStats

PLOT_INTERVAL_S = 0.1
PANEL_WIDTH = 300
MIN_ROUNDS_SHOWN = 10  # the x axis of the rounds chart spans at least this many rounds
MIN_POSITIONS_SHOWN = 4  # so one bar is a bar, not the whole plot
BAR_WIDTH = 0.6
MIN_TICK_SPACING_PX = 22  # between two tick labels of a chart axis
EMPTY_CHARTS_TEXT = "Charts of each drafting round appear here while a reply is written."

__all__ = ["StatsPanel", "stats_from_dict", "DASH", "FIELDS"]


class IntegerAxis(pg.AxisItem):
    """Ticks at whole numbers only, never below zero (rounds, positions, tokens, percent)."""

    def tickValues(self, minVal, maxVal, size):  # noqa: N802, N803 - pyqtgraph's names
        low, high = max(0, math.ceil(minVal)), math.floor(maxVal)
        if high < low:
            return []
        # at most 6 ticks, MIN_TICK_SPACING_PX apart at least, so that labels never touch (a small
        # window's charts stacked 0 to 6 in 50 pixels)
        pixels_per_unit = size / max(maxVal - minVal, 1e-9)
        step = 1
        for candidate in (1, 2, 5, 10, 20, 25, 50, 100, 200, 500, 1000):
            step = candidate
            if (high - low) / candidate <= 6 and candidate * pixels_per_unit >= MIN_TICK_SPACING_PX:
                break
        first = low + (-low % step)
        return [(step, list(range(first, high + 1, step)))]

    def tickStrings(self, values, scale, spacing):  # noqa: N802
        return [str(int(round(v))) for v in values]


def _plot(title: str, bottom: str) -> pg.PlotWidget:
    axes = {"bottom": IntegerAxis("bottom"), "left": IntegerAxis("left")}
    plot = pg.PlotWidget(axisItems=axes)
    plot.setTitle(title)
    plot.setLabel("bottom", bottom)
    plot.setMouseEnabled(x=False, y=False)
    plot.setMenuEnabled(False)
    plot.hideButtons()
    plot.disableAutoRange()
    plot.setMinimumHeight(120)
    return plot


class StatsPanel(QtWidgets.QWidget):
    """Call update_stats() with a GenerationStats snapshot after every round; the caller must not
    mutate that object afterwards, since the throttled plot redraw reads it later."""

    def __init__(self, parent: QtWidgets.QWidget | None = None, plot_interval_s: float = PLOT_INTERVAL_S):
        super().__init__(parent)
        self._plot_interval_s = plot_interval_s
        self._stats: GenerationStats | None = None
        self._drafter: str | None = None
        self._last_plot_at = float("-inf")
        self.plot_redraws = 0  # how many times the plots were redrawn; the throttle is tested on it
        self.setFixedWidth(PANEL_WIDTH)

        self._plot_timer = QTimer(self)
        self._plot_timer.setSingleShot(True)
        self._plot_timer.timeout.connect(self._redraw_plots)

        self._caption = QtWidgets.QLabel()
        self._caption.setWordWrap(True)
        self._values: dict[str, QtWidgets.QLabel] = {}
        self._form = form = QtWidgets.QFormLayout()
        form.setRowWrapPolicy(QtWidgets.QFormLayout.RowWrapPolicy.WrapLongRows)
        for key, label in FIELDS:
            value = QtWidgets.QLabel(DASH)
            value.setWordWrap(True)
            self._values[key] = value
            form.addRow(label + ":", value)
        self._values["speedup"].setToolTip(SPEEDUP_TOOLTIP)
        self._note = QtWidgets.QLabel()
        self._note.setWordWrap(True)
        self._note.setVisible(False)

        self._lengths_plot = _plot("Tokens per round", "round")
        self._lengths_curve = self._lengths_plot.plot([], [])
        self._k_curve = self._lengths_plot.plot([], [])
        self._key = QtWidgets.QLabel()  # says which line is which, beside the chart rather than over it

        self._position_plot = _plot("Accepted by draft position (%)", "position")
        self._position_bars = pg.BarGraphItem(x=[], height=[], width=BAR_WIDTH)
        self._position_plot.addItem(self._position_bars)

        self._charts = QtWidgets.QWidget()
        charts = QtWidgets.QVBoxLayout(self._charts)
        charts.setContentsMargins(0, 0, 0, 0)
        charts.addWidget(self._lengths_plot, 1)
        charts.addWidget(self._key)
        charts.addWidget(self._position_plot, 1)
        self._empty = QtWidgets.QLabel(EMPTY_CHARTS_TEXT)
        self._empty.setWordWrap(True)
        self._empty.setAlignment(QtCore.Qt.AlignmentFlag.AlignCenter)

        layout = QtWidgets.QVBoxLayout(self)
        layout.addWidget(self._caption)
        layout.addLayout(form)
        layout.addWidget(self._note)
        layout.addWidget(self._charts, 1)
        layout.addWidget(self._empty, 1)
        self._apply_palette()
        self.reset()

    # --- public API ------------------------------------------------------------------------------

    def set_drafter(self, drafter: str | None) -> None:
        """The drafter of the loaded pair, shown before the first reply."""
        self._drafter = drafter
        if self._stats is None:
            self.reset()

    def update_stats(self, stats: GenerationStats, caption: str = "The reply being written") -> None:
        self._stats = stats
        self._caption.setText(f"<b>{html.escape(caption)}</b>")
        self._show_numbers(stats)
        self._request_plot()

    def show_saved(self, stats_dict: dict | None, caption: str = "The selected reply") -> None:
        """Show a stored message's stats (GenerationStats.to_dict() output), plots included, at once."""
        self.reset()
        if not stats_dict:
            return
        stats = stats_from_dict(stats_dict)
        self._stats = stats
        self._caption.setText(f"<b>{html.escape(caption)}</b>")
        self._show_numbers(stats)
        self._redraw_plots()

    def reset(self) -> None:
        self._plot_timer.stop()
        self._stats = None
        self._caption.setText(
            "<b>Before the first reply</b><br>The numbers appear as soon as a reply starts."
        )
        for key, text in empty_stats(self._drafter).items():
            self._values[key].setText(text)
            self._form.setRowVisible(self._values[key], key == "drafter")
        self._note.clear()
        self._note.setVisible(False)
        self._lengths_curve.setData([], [])
        self._k_curve.setData([], [])
        self._position_bars.setOpts(x=[], height=[])
        self._set_ranges(0, 0, 0)
        self._charts.setVisible(False)
        self._empty.setVisible(True)

    def value_text(self, key: str) -> str:
        """The text shown for one of FIELDS' keys."""
        return self._values[key].text()

    def caption_text(self) -> str:
        return self._caption.text()

    def note_text(self) -> str:
        return self._note.text() if self._note.isVisibleTo(self) else ""

    def charts_visible(self) -> bool:
        return self._charts.isVisibleTo(self)

    def plotted_lengths(self) -> list[float]:
        _, y = self._lengths_curve.getData()
        return [] if y is None else [float(v) for v in y]

    def plotted_position_acceptance(self) -> list[float]:
        heights = self._position_bars.opts.get("height")
        return [] if heights is None else [float(v) / 100 for v in heights]

    def plots(self) -> tuple[pg.PlotWidget, pg.PlotWidget]:
        return self._lengths_plot, self._position_plot

    # --- drawing ---------------------------------------------------------------------------------

    def _show_numbers(self, stats: GenerationStats) -> None:
        for key, text in format_stats(stats).items():
            self._values[key].setText(text)
            self._form.setRowVisible(self._values[key], True)
        text = notice(stats)
        self._note.setText(text)
        self._note.setVisible(bool(text))

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
        self._lengths_curve.setData(list(range(1, len(lengths) + 1)), lengths)
        k_history = list(stats.k_history)
        self._k_curve.setData(list(range(1, len(k_history) + 1)), k_history)
        acceptance = [100 * rate for rate in stats.per_position_acceptance()]
        self._position_bars.setOpts(x=list(range(1, len(acceptance) + 1)), height=acceptance)
        tallest = max([*lengths, *k_history, 1])
        self._set_ranges(max(len(lengths), len(k_history)), tallest, len(acceptance))
        self._charts.setVisible(True)
        self._empty.setVisible(False)

    def _set_ranges(self, rounds: int, tallest: float, positions: int) -> None:
        self._lengths_plot.setXRange(1, max(rounds, MIN_ROUNDS_SHOWN), padding=0)
        self._lengths_plot.setYRange(0, math.ceil(tallest) + 1, padding=0)
        self._position_plot.setXRange(
            0.5 - BAR_WIDTH / 2, max(positions, MIN_POSITIONS_SHOWN) + 0.5, padding=0
        )
        self._position_plot.setYRange(0, 100, padding=0)

    # --- palette ---------------------------------------------------------------------------------

    def _apply_palette(self) -> None:
        palette = self.palette()
        role = QtGui.QPalette.ColorRole
        background, text = palette.color(role.Base), palette.color(role.Text)
        line, muted = palette.color(role.Highlight), palette.color(role.PlaceholderText)
        for plot in (self._lengths_plot, self._position_plot):
            plot.setBackground(background)
            for name in ("bottom", "left"):
                axis = plot.getAxis(name)
                axis.setPen(pg.mkPen(muted))
                axis.setTextPen(pg.mkPen(text))
            plot.setTitle(plot.plotItem.titleLabel.text, color=text)
            plot.setLabel("bottom", plot.getAxis("bottom").labelText, color=text.name())
        self._lengths_curve.setPen(pg.mkPen(line, width=2))
        self._k_curve.setPen(pg.mkPen(muted, width=1, style=QtCore.Qt.PenStyle.DashLine))
        self._position_bars.setOpts(brush=pg.mkBrush(line), pen=pg.mkPen(line))
        self._key.setText(
            f'<span style="color:{line.name()};">━━</span> tokens per round &nbsp; '
            f'<span style="color:{muted.name()};">╌╌</span> K'
        )

    def changeEvent(self, event):  # noqa: N802
        super().changeEvent(event)
        if event.type() == QtCore.QEvent.Type.PaletteChange:
            self._apply_palette()
