"""Background work in the status bar: the stage, its counts, the time it has taken, and an estimate of
the time left where the counts allow one. Nothing modal: the window stays usable while models load,
kernels build and compiled paths are made.

StageClock is the arithmetic (pure, tested without a window); LoadProgress shows it and owns the timer
that keeps the elapsed time moving while a stage reports nothing (a kernel build reports once).
"""

from __future__ import annotations

import time

from app.qt import QTimer, QtWidgets, Signal

MIN_ETA_S = 3.0  # a rate is trusted after this long and one more count
TICK_MS = 1000


def duration(seconds: float) -> str:
    """'45 s', '3 min 05 s', '1 h 02 min'."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class StageClock:
    """One stage of background work at a time: how long it has run, and how long it has left where its
    counts move (the rate since the stage's first report, so a slow start does not skew it)."""

    def __init__(self):
        self.stage = ""
        self.done = self.total = 0
        self.started = self._first_at = 0.0
        self._first_done = 0

    def update(self, stage: str, done: int, total: int, now: float) -> None:
        if stage != self.stage or done < self.done:
            self.stage, self.started = stage, now
            self._first_done, self._first_at = done, now
        self.done, self.total = done, total

    def remaining_s(self, now: float) -> float | None:
        """Seconds left, or None where they cannot be told yet (no counts, or not enough of them)."""
        counted = self.done - self._first_done
        spent = now - self._first_at
        if self.total <= 0 or counted <= 0 or spent < MIN_ETA_S or self.done >= self.total:
            return None
        return (self.total - self.done) * spent / counted

    def text(self, now: float) -> str:
        """e.g. "Loading models… 3/10 · about 40 s left" or "Building kernels… 1 min 12 s"."""
        parts = [f"{self.stage}…"]
        if self.total > 1:
            parts.append(
                f"{self.done}/{self.total}" if self.total <= 1000 else f"{self.done / self.total:.0%}"
            )
        left = self.remaining_s(now)
        timing = f"about {duration(left)} left" if left is not None else duration(now - self.started)
        return " ".join(parts) + " · " + timing


class LoadProgress(QtWidgets.QWidget):
    """Stage, counts and time of the load under way, with a Cancel button; hidden when nothing loads."""

    cancel_requested = Signal()

    def __init__(self, parent=None, clock=time.monotonic):
        super().__init__(parent)
        self._clock = clock
        self.stage_clock = StageClock()
        layout = QtWidgets.QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.label = QtWidgets.QLabel(self)
        self.bar = QtWidgets.QProgressBar(self)
        self.bar.setMaximumWidth(140)
        self.bar.setTextVisible(False)
        self.cancel_button = QtWidgets.QToolButton(self)
        self.cancel_button.setText("Cancel")
        self.cancel_button.setToolTip("Stop loading; the model that answers now keeps answering")
        self.cancel_button.setAutoRaise(True)
        self.cancel_button.clicked.connect(self.cancel_requested)
        for widget in (self.label, self.bar, self.cancel_button):
            layout.addWidget(widget)
        self._timer = QTimer(self)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self._refresh)
        self.setVisible(False)

    def start(self, stage: str) -> None:
        self.show_progress(stage, 0, 0)
        self._timer.start()

    def show_progress(self, stage: str, done: int, total: int) -> None:
        self.stage_clock.update(stage, done, total, self._clock())
        self.bar.setMaximum(max(total, 0))
        self.bar.setValue(min(done, total) if total > 0 else 0)
        self.setVisible(True)
        self._refresh()

    def finish(self) -> None:
        self._timer.stop()
        self.setVisible(False)

    def text(self) -> str:
        return self.label.text() if not self.isHidden() else ""

    def _refresh(self) -> None:
        self.label.setText(self.stage_clock.text(self._clock()))
