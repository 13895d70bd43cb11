"""How many CPU threads a reply runs on, from how busy the machine was just before it.

Every kernel call ends with its OpenMP threads meeting at a barrier. On a machine whose cores other
programs keep busy, one of Tandem's threads is often waiting for the scheduler while the others spin
at that barrier, so two threads can run many times slower than one (measured on 2 cores beside
two busy loops: 29.5 ms a step on 2 threads against 23.9 ms on 1; quiet, 12.3 ms against 23 ms).
Before each reply the engine asks for the cores that other programs left free since its last reply
ended (from /proc/stat, less this process's own CPU time) and runs on that many threads, at least
one and at most torch's default. Where /proc/stat is missing the default stays.

TANDEM_THREADS=N fixes the count (the tests fix it, so that runs compare alike).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

MIN_WINDOW_S = 0.25  # a shorter gap between replies says too little: the last choice stays


def machine_busy_seconds() -> float | None:
    """CPU seconds all cores have spent busy since boot (None where /proc/stat cannot be read): user,
    nice, system, irq and softirq; idle, iowait and the time a hypervisor gave to other machines aside."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return (sum(fields[:7]) - idle) / os.sysconf("SC_CLK_TCK")  # steal time left out


def own_seconds() -> float:
    times = os.times()
    return times.user + times.system


@dataclass
class Sample:
    wall: float
    busy: float
    own: float


def take_sample() -> Sample | None:
    busy = machine_busy_seconds()
    return None if busy is None else Sample(time.monotonic(), busy, own_seconds())


def threads_for(free_cores: float, default: int) -> int:
    """Threads for the cores others leave free: at least one, at most the default."""
    return max(1, min(default, math.floor(free_cores + 0.5)))


@functools.lru_cache(maxsize=1)
def torch_default_threads() -> int:
    """torch's own thread count, as it was before any reply changed it. Read once per process: torch's
    count is the process's, and a reply's choice (or a second engine's) must not become the default."""
    import torch

    return torch.get_num_threads()


@contextlib.contextmanager
def threads_set_to(count: int) -> Iterator[None]:
    """torch runs on `count` threads inside the block, and on what it ran before after it."""
    import torch

    previous = torch.get_num_threads()
    if previous != count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


class ThreadChooser:
    """Chooses the thread count before each reply (choose) and marks the end of each (reply_ended)."""

    def __init__(
        self,
        default: int | None = None,
        cores: int | None = None,
        sample: Callable[[], Sample | None] = take_sample,
    ):
        self.default = default or torch_default_threads()
        self.cores = cores or os.cpu_count() or 1
        fixed = os.environ.get("TANDEM_THREADS", "").strip()
        self.fixed = int(fixed) if fixed.isdigit() and int(fixed) > 0 else None
        self.threads = self.fixed or self.default
        self.others_busy: float | None = None  # cores other programs kept busy in the last window
        self._sample = sample  # the machine's reading now (the tests feed their own)
        self._since = sample()

    def choose(self) -> int:
        """The thread count for the reply about to start, set for the calling thread's kernels."""
        import torch

        if self.fixed is None:
            now = self._sample()
            since = self._since
            if now is not None and since is not None and now.wall - since.wall >= MIN_WINDOW_S:
                others = (now.busy - since.busy) - (now.own - since.own)
                self.others_busy = max(0.0, others / (now.wall - since.wall))
                self.threads = threads_for(self.cores - self.others_busy, self.default)
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        return self.threads

    @property
    def steady(self) -> int:
        """The count that does not follow the load (TANDEM_THREADS, else torch's default): what the
        verify cost is measured on, so a curve stored after a reply ran on fewer threads is found again
        by the next start (engine.runtime.calibration keys curves by the count they were measured on)."""
        return self.fixed or self.default

    def others_busy_now(self) -> float | None:
        """Cores other programs have kept busy since the last reply ended (or since this chooser was
        made), without changing the choice; None where /proc/stat cannot tell."""
        now, since = self._sample(), self._since
        if now is None or since is None or now.wall <= since.wall:
            return None
        return max(0.0, ((now.busy - since.busy) - (now.own - since.own)) / (now.wall - since.wall))

    def reply_ended(self) -> None:
        """The window for the next choice starts here: the time between replies is others' alone."""
        self._since = self._sample()
