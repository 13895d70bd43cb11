"""The thread count follows the cores other programs leave free (engine.runtime.threads).

The chooser is fed the readings a test tells it (wall time, the machine's busy CPU time, this
process's own), so what it decides does not depend on how busy the machine running the tests is;
one test checks the real readings those stand for.
"""

from __future__ import annotations

import os

import pytest
import torch

from engine.runtime.threads import (
    MIN_WINDOW_S,
    Sample,
    ThreadChooser,
    machine_busy_seconds,
    own_seconds,
    take_sample,
    threads_for,
)


class Readings:
    """A machine as the test tells it: wall seconds, CPU seconds all cores spent busy, and this
    process's own CPU seconds; advance() lets time pass with some cores kept busy."""

    def __init__(self) -> None:
        self.wall, self.busy, self.own = 1000.0, 5000.0, 10.0
        self.readable = True

    def __call__(self) -> Sample | None:
        return Sample(self.wall, self.busy, self.own) if self.readable else None

    def advance(self, seconds: float, others: float = 0.0, own: float = 0.0) -> None:
        """`others` and `own`: cores kept busy by other programs and by this process."""
        self.wall += seconds
        self.own += own * seconds
        self.busy += (others + own) * seconds


@pytest.fixture
def threads_kept(monkeypatch):
    monkeypatch.delenv("TANDEM_THREADS", raising=False)
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def test_threads_for_the_free_cores_at_least_one_at_most_the_default():
    assert threads_for(2.0, 2) == 2
    assert threads_for(1.4, 2) == 1
    assert threads_for(0.1, 2) == 1
    assert threads_for(7.0, 4) == 4


def test_a_machine_kept_busy_by_others_gets_one_thread_and_this_process_own_work_does_not_count(threads_kept):
    machine = Readings()
    chooser = ThreadChooser(default=2, cores=2, sample=machine)
    machine.advance(1.0, own=1.0)  # this process's own work, between two replies: not another program's load
    assert chooser.choose() == 2 and chooser.others_busy == pytest.approx(0.0)
    chooser.reply_ended()
    machine.advance(1.5, others=2.0)  # two busy loops
    assert chooser.choose() == 1 and chooser.others_busy == pytest.approx(2.0)
    assert torch.get_num_threads() == 1
    chooser.reply_ended()
    machine.advance(1.0, others=0.1)
    assert chooser.choose() == 2, chooser.others_busy  # the load gone, both threads again
    assert torch.get_num_threads() == 2


def test_the_count_rounds_the_free_cores_and_counts_only_the_window_since_the_last_reply(threads_kept):
    machine = Readings()
    chooser = ThreadChooser(default=4, cores=4, sample=machine)
    machine.advance(2.0, others=3.6)  # during the reply: not the window that counts
    chooser.reply_ended()
    machine.advance(1.0, others=1.4, own=0.5)
    assert chooser.choose() == 3 and chooser.others_busy == pytest.approx(1.4)  # 2.6 cores free
    chooser.reply_ended()
    machine.advance(1.0, others=2.6)
    assert chooser.choose() == 1  # 1.4 free


def test_a_short_gap_or_no_reading_keeps_the_last_choice(threads_kept):
    machine = Readings()
    chooser = ThreadChooser(default=2, cores=2, sample=machine)
    machine.advance(1.0, others=2.0)
    assert chooser.choose() == 1
    chooser.reply_ended()
    machine.advance(MIN_WINDOW_S / 2)  # too short a window to say the load is gone
    assert chooser.choose() == 1
    machine.readable = False  # no /proc/stat
    chooser.reply_ended()
    machine.advance(1.0)
    assert chooser.choose() == 1
    assert ThreadChooser(default=2, cores=2, sample=machine).choose() == 2  # the default stays


def test_tandem_threads_fixes_the_count(monkeypatch):
    monkeypatch.setenv("TANDEM_THREADS", "1")
    previous = torch.get_num_threads()
    try:
        machine = Readings()
        chooser = ThreadChooser(default=2, cores=2, sample=machine)
        machine.advance(1.0)  # a quiet machine
        assert chooser.choose() == 1 and chooser.others_busy is None
    finally:
        torch.set_num_threads(previous)


@pytest.mark.skipif(machine_busy_seconds() is None, reason="needs /proc/stat")
def test_the_readings_count_this_process_cpu_time_in_the_machine_busy_time():
    """What the chooser is fed by default: the machine's busy time grows at least by this process's
    own (measured in CPU time, so a busy machine only makes the loop take longer)."""
    before = take_sample()
    end = own_seconds() + 0.3
    while own_seconds() < end:
        pass
    after = take_sample()
    own = after.own - before.own
    assert own >= 0.3 - 0.02 and after.wall > before.wall  # the samples count in clock ticks (10 ms)
    # the kernel samples both in clock ticks, and a hypervisor may count a little as stolen
    assert after.busy - before.busy >= 0.5 * own, (after.busy - before.busy, own)
    assert after.busy - before.busy <= (after.wall - before.wall) * (os.cpu_count() or 1) + 0.1
