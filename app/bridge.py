"""The engine on a worker thread, talking to the GUI through signals; new engines built beside it.

The GUI never touches a model. It asks the workers through queued signals and hears back through their
signals, which Qt delivers on the GUI thread because their receivers live there. Stopping is a
threading.Event the GUI sets directly, so it takes effect while a worker is busy.

Two workers, one pattern: the engine worker answers; the loader worker builds the next engine (loading,
kernel builds, conversions, calibration) while the engine worker keeps answering with the one it has,
then hands it over between two replies. torch and transformers are imported by the engine factory
(app/engine_factory.py), which runs on the loader thread only.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.engine_factory import (
    EngineFactory,
    EngineInfo,
    LoadRequest,
    ProgressCallback,
    default_engine_factory,
    kernel_lines,
    remote_engine_factory,
)
from app.qt import QObject, QThread, Signal, Slot
from app.titles import title_messages, title_sampling
from engine.errors import TandemError
from engine.events import Failed, Finished, PrefillProgress, Progress, RoundStats, TextPiece
from engine.settings import SamplingSettings, SpeculationSettings


class LoadCancelled(Exception):
    pass


def _emit_while_alive(signal) -> Callable:
    """signal.emit for the engine's own threads, which may outlive the window: once Qt has deleted the
    worker (the window closed while the engine optimized in the background) there is nobody to tell."""

    def emit(*args) -> None:
        with contextlib.suppress(RuntimeError):  # "Signal source has been deleted"
            signal.emit(*args)

    return emit


class LoaderWorker(QObject):
    """Lives on the loader thread and builds engines there, so the engine thread keeps answering with
    the engine it has until the new one is ready. Every signal is received on the GUI thread; each
    carries the number of the load it belongs to, so the bridge can drop what a newer load replaced."""

    progress = Signal(int, str, int, int)  # load number, stage, done, total
    built = Signal(int, object, object)  # load number, engine, EngineInfo
    load_failed = Signal(int, str, str)  # load number, message for the user, details
    load_cancelled = Signal(int)
    # the engine's background optimization (ChatEngine.optimize_in_background), from its own thread
    optimizing = Signal(str, int, int)
    optimized = Signal(str)  # how it ended, for the user

    def __init__(self, factory: EngineFactory):
        super().__init__()
        self._factory = factory

    @Slot(int, object, object)
    def load(self, number: int, request: LoadRequest, cancel: threading.Event) -> None:
        def progress(stage: str, done: int, total: int) -> None:
            if cancel.is_set():
                raise LoadCancelled
            self.progress.emit(number, stage, done, total)

        try:
            progress("Loading models", 0, 0)
            engine, info = self._factory(request, progress)
            if cancel.is_set():
                raise LoadCancelled
        except LoadCancelled:
            self.load_cancelled.emit(number)
            return
        except TandemError as exc:
            self.load_failed.emit(number, str(exc), traceback.format_exc())
            return
        except Exception as exc:  # a bug or an unexpected library failure: shown, never a crash
            self.load_failed.emit(number, f"Could not load the models: {exc}", traceback.format_exc())
            return
        self.built.emit(number, engine, info)
        if cancel.is_set():  # a newer load replaced this one: it will not answer
            return
        self._build_tree_graph(engine)
        start = getattr(engine, "optimize_in_background", None)
        if start is not None:
            start(_emit_while_alive(self.optimizing), _emit_while_alive(self.optimized))

    def _build_tree_graph(self, engine) -> None:
        """The token-tree graph that prepare left (tree_graph_later), after "Ready" and on the thread that
        ran prepare (dynamo traces it five times slower on another); it holds the engine's lock, so a
        reply asked for meanwhile waits seconds."""
        build = getattr(engine, "build_tree_graph", None)
        if build is None:
            return
        shown = []

        def progress(stage: str, done: int, total: int) -> None:
            shown.append(stage)
            self.optimizing.emit(stage, done, total)

        if build(progress):
            self.optimized.emit("Token trees ready: one verify forward may now check several drafts.")
        elif shown:  # it did not build: clear the progress
            self.optimized.emit("")


class EngineWorker(QObject):
    """Lives on the engine thread. Every slot runs there; every signal is received on the GUI thread."""

    loaded = Signal(object)  # EngineInfo of the engine that answers from now on
    progress = Signal(str, int, int)  # what a reply waits for (Progress events)
    reading = Signal(object)  # PrefillProgress: how far a long prompt is read, before the first token
    piece = Signal(object)  # TextPiece
    round_stats = Signal(object)  # GenerationStats, a copy the GUI may keep
    finished = Signal(object)  # Finished
    failed = Signal(str, str)  # message for the user, details
    titled = Signal(int, str)  # conversation id, the title the model wrote
    settings_applied = Signal()  # the engine reads the new settings from its next reply on

    def __init__(self):
        super().__init__()
        self._engine = None

    @Slot(object, object)
    def install(self, engine, info: EngineInfo) -> None:
        """Queued behind any running reply: the next reply is the new engine's; the old one is dropped."""
        self._engine = engine
        self.loaded.emit(info)

    @Slot(object, object)
    def apply_settings(self, speculation: SpeculationSettings, sampling: SamplingSettings) -> None:
        # Queued behind any running reply, so the engine never sees settings change mid-generation.
        if self._engine is not None:
            self._engine.speculation = speculation
            self._engine.sampling = sampling
            self.settings_applied.emit()

    @Slot(object, object)
    def respond(self, messages: list[dict], cancel: threading.Event) -> None:
        if self._engine is None:
            self.failed.emit("No model is loaded. Open Settings (Ctrl+,) to choose one.", "")
            return
        failure: list[Failed] = []

        def on_event(event) -> None:
            if isinstance(event, TextPiece):
                self.piece.emit(event)
            elif isinstance(event, RoundStats):
                self.round_stats.emit(event.stats.copy())
            elif isinstance(event, Failed):
                failure.append(event)
            elif isinstance(event, Progress):
                self.progress.emit(event.stage, event.done, event.total)
            elif isinstance(event, PrefillProgress):
                self.reading.emit(event)

        try:
            result = self._engine.respond(messages, on_event=on_event, cancel=cancel)
        except TandemError as exc:
            self.failed.emit(str(exc), traceback.format_exc())
            return
        except Exception as exc:
            self.failed.emit(f"Generation failed: {exc}", traceback.format_exc())
            return
        if failure:
            self.failed.emit(failure[0].message, failure[0].details)
        elif isinstance(result, Finished):
            self.finished.emit(result)
        else:
            self.failed.emit("The engine returned no result.", repr(result))

    @Slot(int, object, object)
    def name_conversation(self, conversation_id: int, history: list[dict], cancel: threading.Event) -> None:
        """The model's title for a conversation (app/titles.py); a reply asked for meanwhile cancels it."""
        engine = self._engine
        if engine is None or cancel.is_set():
            return
        sampling = engine.sampling
        engine.sampling = title_sampling(sampling)
        try:
            result = engine.respond(title_messages(history), on_event=lambda _event: None, cancel=cancel)
        except Exception:  # noqa: BLE001 - a title is a nicety: the first message's stays
            result = None
        finally:
            engine.sampling = sampling
        if not isinstance(result, Finished):
            self.titled.emit(conversation_id, "")  # no title: nothing to ask again
        elif result.reason != "cancelled":  # a cancelled one is asked again (EngineBridge._resume_title)
            self.titled.emit(conversation_id, result.text)


@dataclass
class _StopFlags:
    generation: threading.Event = field(default_factory=threading.Event)
    load: threading.Event = field(default_factory=threading.Event)
    title: threading.Event = field(default_factory=threading.Event)

    def set_all(self) -> None:
        for flag in (self.generation, self.load, self.title):
            flag.set()


def _stop_threads(threads: tuple[QThread, ...], stops: _StopFlags, *_args, timeout_ms: int = 15000) -> bool:
    """timeout_ms < 0 waits as long as it takes."""
    stops.set_all()
    for thread in threads:
        thread.quit()
    return all(thread.wait() if timeout_ms < 0 else thread.wait(timeout_ms) for thread in threads)


class EngineBridge(QObject):
    """The GUI side: owns the engine thread (replies) and the loader thread (new engines), starts work on
    them, and stops it. A loaded engine is handed to the engine thread between two replies."""

    load_progress = Signal(str, int, int)  # of the current load
    load_failed = Signal(str, str)
    load_cancelled = Signal()
    _load_requested = Signal(int, object, object)
    _install_requested = Signal(object, object)
    _respond_requested = Signal(object, object)
    _settings_requested = Signal(object, object)
    _title_requested = Signal(int, object, object)

    def __init__(self, factory: EngineFactory = default_engine_factory, parent: QObject | None = None):
        super().__init__(parent)
        # Children of the bridge, and stopped when the bridge is destroyed (destroyed is emitted before
        # children are deleted): a window dropped without closing must not destroy a running QThread.
        self._thread = QThread(self)
        self._thread.setObjectName("tandem-engine")
        self._loader_thread = QThread(self)
        self._loader_thread.setObjectName("tandem-loader")
        self._stops = _StopFlags()
        threads = (self._loader_thread, self._thread)
        self.destroyed.connect(functools.partial(_stop_threads, threads, self._stops))
        self.worker = EngineWorker()
        self.worker.moveToThread(self._thread)
        self.loader = LoaderWorker(factory)
        self.loader.moveToThread(self._loader_thread)
        for thread, worker in zip(threads, (self.loader, self.worker), strict=True):
            thread.finished.connect(worker.deleteLater)
        self._load_requested.connect(self.loader.load)
        self._install_requested.connect(self.worker.install)
        self._respond_requested.connect(self.worker.respond)
        self._settings_requested.connect(self.worker.apply_settings)
        self._title_requested.connect(self.worker.name_conversation)
        self.loader.progress.connect(self._on_progress)
        self.loader.built.connect(self._on_built)
        self.loader.load_failed.connect(self._on_load_failed)
        self.loader.load_cancelled.connect(self._on_load_cancelled)
        self.worker.loaded.connect(self._on_loaded)
        self.worker.titled.connect(self._on_titled)
        self._title: tuple[int, list[dict]] | None = None  # a title asked for and not yet written
        self.info: EngineInfo | None = None  # the engine that answers; kept when a new load fails
        self.loading = False  # a load is under way
        self._load_number = 0
        self._installs: list[int] = []  # load numbers handed to the engine thread, oldest first
        self._loader_thread.start()
        self._thread.start()
        self.probes = Probes(self)

    def load(self, request: LoadRequest) -> None:
        """Load a new engine beside the one that answers; a load still under way is cancelled."""
        self._stops.load.set()
        self._stops.load = threading.Event()
        self._load_number += 1
        self.loading = True
        self._load_requested.emit(self._load_number, request, self._stops.load)

    def cancel_load(self) -> None:
        self._stops.load.set()

    def respond(self, messages: list[dict]) -> None:
        title = self._interrupt_title()  # a title being written gives way to the reply, and follows it
        self._stops.generation = threading.Event()
        self._respond_requested.emit(messages, self._stops.generation)
        self._resume_title(title)

    def stop(self) -> None:
        self._stops.generation.set()

    def apply_settings(self, speculation: SpeculationSettings, sampling: SamplingSettings) -> None:
        """Settings for the next reply: in place as soon as the engine thread is between replies (a
        title being written stops for them, then starts again)."""
        title = self._interrupt_title()
        self._settings_requested.emit(speculation, sampling)
        self._resume_title(title)

    def name_conversation(self, conversation_id: int, history: list[dict]) -> None:
        """Ask the engine for a title; `worker.titled` answers, after any reply or settings that come first."""
        self._title = (conversation_id, history)
        self._stops.title = threading.Event()
        self._title_requested.emit(conversation_id, history, self._stops.title)

    def _interrupt_title(self) -> tuple[int, list[dict]] | None:
        """Stop a title being written (it is cheap to write again); returns what it was for."""
        title, self._title = self._title, None
        if title is not None:
            self._stops.title.set()
        return title

    def _resume_title(self, title: tuple[int, list[dict]] | None) -> None:
        if title is not None:
            self.name_conversation(*title)

    @Slot(int, str)
    def _on_titled(self, _conversation_id: int, _text: str) -> None:
        self._title = None

    def shutdown(self, timeout_ms: int = 15000) -> bool:
        """Stop any work, end the threads; True when they ended in time."""
        self.probes.shutdown(timeout_ms)
        return _stop_threads((self._loader_thread, self._thread), self._stops, timeout_ms=timeout_ms)

    @Slot(int, str, int, int)
    def _on_progress(self, number: int, stage: str, done: int, total: int) -> None:
        if number == self._load_number:
            self.load_progress.emit(stage, done, total)

    @Slot(int, object, object)
    def _on_built(self, number: int, engine, info: EngineInfo) -> None:
        if number == self._load_number:  # else a newer load replaced it: it is dropped here
            self._installs.append(number)
            self._install_requested.emit(engine, info)

    @Slot(int, str, str)
    def _on_load_failed(self, number: int, message: str, details: str) -> None:
        if number == self._load_number:
            self.loading = False
            self.load_failed.emit(message, details)

    @Slot(int)
    def _on_load_cancelled(self, number: int) -> None:
        if number == self._load_number:
            self.loading = False
            self.load_cancelled.emit()

    @Slot(object)
    def _on_loaded(self, info: EngineInfo) -> None:
        self.loading = self._installs.pop(0) != self._load_number if self._installs else False
        self.info = info


class ProbeWorker(QObject):
    """Lives on the probe thread: runs one short look-up at a time and reports it back."""

    done = Signal(str, int, object, object)  # kind, token, result, error

    @Slot(str, int, object)
    def run(self, kind: str, token: int, work: Callable[[], Any]) -> None:
        try:
            result, error = work(), None
        except Exception as exc:  # shown by the asker; a look-up must never take the app down
            result, error = None, exc
        self.done.emit(kind, token, result, error)


class Probes(QObject):
    """Short engine look-ups for dialogs (engine/models/probes.py: tokenizer checks, memory estimates,
    the devices torch sees) on a thread of their own, with the same worker-and-signals pattern as
    the engine's worker. They get their own thread so a dialog answers while a reply is generating or
    a model loads; they only read files and never touch the loaded models.

    `submit(kind, work)` returns a token; `answered(kind, token, result, error)` arrives on the GUI
    thread. A newer submit of the same kind makes older answers stale: those are not delivered.
    """

    answered = Signal(str, int, object, object)
    _requested = Signal(str, int, object)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._thread = QThread(self)
        self._thread.setObjectName("tandem-probes")
        self._worker = ProbeWorker()
        self._worker.moveToThread(self._thread)
        self._thread.finished.connect(self._worker.deleteLater)
        self._requested.connect(self._worker.run)
        self._worker.done.connect(self._on_done)
        self._tokens: dict[str, int] = {}
        # Look-ups are short and downloads stop at their next progress report, so this waits for them;
        # the worker is cut off first, so nothing is delivered to an object being destroyed.
        self.destroyed.connect(functools.partial(_abandon, self._thread, self._worker))
        self._thread.start()

    def submit(self, kind: str, work: Callable[[], Any]) -> int:
        token = self._tokens.get(kind, 0) + 1
        self._tokens[kind] = token
        self._requested.emit(kind, token, work)
        return token

    def forget(self, kind: str) -> None:
        """Drop any answer still to come for kind."""
        self._tokens[kind] = self._tokens.get(kind, 0) + 1

    def shutdown(self, timeout_ms: int = 15000) -> bool:
        return _quit_thread(self._thread, timeout_ms=timeout_ms)

    @Slot(str, int, object, object)
    def _on_done(self, kind: str, token: int, result: Any, error: BaseException | None) -> None:
        if token == self._tokens.get(kind):
            self.answered.emit(kind, token, result, error)


def _abandon(thread: QThread, worker: ProbeWorker, *_args) -> None:
    with contextlib.suppress(RuntimeError, TypeError):  # nothing was connected any more
        worker.done.disconnect()
    _quit_thread(thread, timeout_ms=-1)


def _quit_thread(thread: QThread, *_args, timeout_ms: int = 15000) -> bool:
    thread.quit()
    return thread.wait() if timeout_ms < 0 else thread.wait(timeout_ms)


__all__ = [
    "EngineBridge",
    "EngineFactory",
    "EngineInfo",
    "EngineWorker",
    "LoadRequest",
    "LoaderWorker",
    "Probes",
    "ProgressCallback",
    "default_engine_factory",
    "kernel_lines",
    "remote_engine_factory",
]
