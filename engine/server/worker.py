"""The engine thread: requests run one at a time, in arrival order, from a bounded queue.

A request that finds the queue full is refused at once (`ServerBusy`, answered as 503). Cancelling a
request sets its `threading.Event`; the engine checks it between rounds, so a running reply stops
within one round, and a waiting one is dropped before it starts.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.backend import ChatBackend
from engine.events import Event, Finished
from engine.server.metrics import ServerMetrics
from engine.settings import SamplingSettings


class ServerBusy(Exception):
    pass


@dataclass
class Job:
    messages: list[dict]
    sampling: SamplingSettings
    on_event: Callable[[Event], None]  # called on the engine thread
    on_done: Callable[[Finished | BaseException], None]  # called once, on the engine thread
    cancel: threading.Event = field(default_factory=threading.Event)
    cancelled_at: float | None = None  # time.monotonic() of the cancel request
    started: bool = False
    disconnect_checked_at: float = field(default_factory=time.monotonic)  # when the server last asked


class EngineWorker:
    def __init__(self, backend: ChatBackend, max_queue: int, metrics: ServerMetrics):
        self.backend = backend
        self.metrics = metrics
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._running = 0
        self._thread = threading.Thread(target=self._run, name="tandem-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise ServerBusy from None
        self._update_depth()

    def cancel(self, job: Job) -> None:
        if not job.cancel.is_set():
            job.cancelled_at = time.monotonic()
            job.cancel.set()

    def stop(self) -> None:
        """Ends the thread after the running request; waiting ones are cancelled."""
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self.cancel(job)
                job.on_done(Finished("cancelled", "", (), _empty_stats()))
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _update_depth(self) -> None:
        self.metrics.queue_depth = self._queue.qsize() + self._running

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            self._running = 1
            self._update_depth()
            try:
                self._serve(job)
            finally:
                self._running = 0
                self._update_depth()

    def _serve(self, job: Job) -> None:
        if job.cancel.is_set():
            job.on_done(Finished("cancelled", "", (), _empty_stats()))
            return
        job.started = True
        self.backend.sampling = job.sampling
        try:
            finished = self.backend.respond(job.messages, on_event=job.on_event, cancel=job.cancel)
        except BaseException as error:  # handed to the request, which answers with an error object
            job.on_done(error)
            return
        if job.cancelled_at is not None:
            self.metrics.add_cancel_latency(time.monotonic() - job.cancelled_at)
        self.metrics.add_generation(finished.stats)
        job.on_done(finished)


def _empty_stats():
    from engine.stats import GenerationStats

    return GenerationStats()
