"""The thread count follows the cores other programs leave free (engine.runtime.threads)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from engine.runtime.threads import ThreadChooser, machine_busy_seconds, threads_for

pytestmark = pytest.mark.skipif(machine_busy_seconds() is None, reason="needs /proc/stat")
BUSY_LOOP = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"


def test_threads_for_the_free_cores_at_least_one_at_most_the_default():
    assert threads_for(2.0, 2) == 2
    assert threads_for(1.4, 2) == 1
    assert threads_for(0.1, 2) == 1
    assert threads_for(7.0, 4) == 4


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_machine_kept_busy_by_others_gets_one_thread_and_this_process_own_work_does_not_count(monkeypatch):
    monkeypatch.delenv("TANDEM_THREADS", raising=False)
    previous = torch.get_num_threads()
    try:
        chooser = ThreadChooser(default=2, cores=2)
        spin(1.0)  # this process's own work, between two replies: not another program's load
        assert chooser.choose() == 2 and chooser.others_busy < 0.75, chooser.others_busy
        loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(2)]
        try:
            time.sleep(0.5)  # the loops are running
            chooser.reply_ended()
            time.sleep(1.5)
            assert chooser.choose() == 1 and chooser.others_busy > 1.25, chooser.others_busy
            assert torch.get_num_threads() == 1
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()
        chooser.reply_ended()
        time.sleep(1.0)
        assert chooser.choose() == 2, chooser.others_busy  # the load gone, both threads again
    finally:
        torch.set_num_threads(previous)


def test_tandem_threads_fixes_the_count(monkeypatch):
    monkeypatch.setenv("TANDEM_THREADS", "1")
    previous = torch.get_num_threads()
    try:
        chooser = ThreadChooser(default=2, cores=2)
        time.sleep(0.3)
        assert chooser.choose() == 1 and chooser.others_busy is None
    finally:
        torch.set_num_threads(previous)
