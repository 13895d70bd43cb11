"""The engine on one worker thread, talking to the GUI through signals.

The GUI never touches a model. It asks the worker through queued signals and hears back through the
worker's signals, which Qt delivers on the GUI thread because their receivers live there. Stopping is a
threading.Event the GUI sets directly, so it takes effect while the worker is busy.

torch and transformers are imported by the engine factory, which runs on the worker only.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.qt import QObject, QThread, Signal, Slot
from engine.errors import SettingsError, TandemError
from engine.events import Failed, Finished, Progress, RoundStats, TextPiece
from engine.settings import SamplingSettings, SpeculationSettings


@dataclass(frozen=True)
class LoadRequest:
    """Which models to load and how: the subset of the app's config that needs a reload to change."""

    target: str
    drafter: str = "model"  # "model", "ngram" or "none"
    draft: str | None = None  # None: a quantized copy of the target
    quantization: str = "int8"
    device: str = "auto"
    dtype: str = "auto"
    compiled: str = "auto"
    draft_on_cpu: bool = False
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    backend: str = "local"  # "local" or "server"
    target_precision: str = "default"  # fp32, bf16, int8, int4, or the device's default
    server_url: str = ""  # for "server"; its API key comes from engine.remote.credentials

    @classmethod
    def from_config(cls, config) -> LoadRequest:
        return cls(
            target=config.target,
            drafter=config.drafter,
            draft=config.draft or None,
            quantization=config.draft_quantization,
            device=config.device,
            dtype=config.dtype,
            compiled=config.compiled,
            draft_on_cpu=config.draft_on_cpu,
            speculation=config.speculation(),
            sampling=config.sampling(),
            backend=config.backend,
            server_url=config.server_url,
            target_precision=config.target_precision,
        )


@dataclass(frozen=True)
class EngineInfo:
    """What the status bar shows about the loaded engine."""

    target: str
    draft: str | None
    device: str
    quantization: str
    notices: tuple[str, ...] = ()  # how the models run, when it is not the fastest path
    kernels: tuple[str, ...] = ()  # the quantized kernel of each quantized model, and why it was chosen


ProgressCallback = Callable[[str, int, int], None]
# factory(request, progress) -> (engine, info). Runs on the worker thread.
EngineFactory = Callable[[LoadRequest, ProgressCallback], tuple[Any, EngineInfo]]


def default_engine_factory(request: LoadRequest, progress: ProgressCallback) -> tuple[Any, EngineInfo]:
    if request.backend == "server":
        return remote_engine_factory(request, progress)
    from engine.models.pair import load_pair
    from engine.session import ChatEngine

    # "auto" may choose the draft model among the drafters, so it loads one too
    draft_spec = request.draft if request.drafter in ("model", "auto") else "none"
    extra = {}
    if request.target_precision != "default":
        if "target_precision" not in inspect.signature(load_pair).parameters:
            raise SettingsError("This version of the engine cannot choose the target's precision.")
        extra["target_precision"] = request.target_precision
    target, draft = load_pair(
        request.target,
        draft_spec,
        quantization=request.quantization,
        device=request.device,
        dtype=request.dtype,
        progress=progress,
        draft_device="cpu" if request.draft_on_cpu else None,
        **extra,
    )
    progress("Preparing the engine", 0, 1)
    engine = ChatEngine(
        target, draft, speculation=request.speculation, sampling=request.sampling, compiled=request.compiled,
        remember_drafters=True,
    )  # fmt: skip
    engine.tree_graph_later = True  # built after "Ready" (EngineWorker._build_tree_graph)
    engine.prepare(progress)
    info = EngineInfo(
        target=target.name,
        draft=draft.name if draft is not None else (None if request.drafter == "none" else request.drafter),
        device=str(target.device),
        quantization=draft.quantization if draft is not None else "none",
        notices=tuple(engine.notices),
        kernels=kernel_lines(target, draft),
    )
    return engine, info


def kernel_lines(*models) -> tuple[str, ...]:
    """'draft: <kernel> — <why>' for each quantized model (LoadedModel.info from engine.models.quantize)."""
    lines = []
    for role, model in zip(("target", "draft"), models, strict=False):
        info = getattr(model, "info", None) or {}
        kernel = info.get("kernel_summary") or info.get("kernel")
        if kernel:
            reason = info.get("kernel_reason")
            lines.append(f"{role}: {kernel}" + (f" — {reason}" if reason else ""))
    return tuple(lines)


def remote_engine_factory(request: LoadRequest, progress: ProgressCallback) -> tuple[Any, EngineInfo]:
    """An OpenAI-compatible server as the engine; prepare() checks that it answers and accepts the key."""
    from engine.remote import RemoteEngine
    from engine.remote.credentials import load_api_key

    progress(f"Connecting to {request.server_url}", 0, 0)
    engine = RemoteEngine(request.server_url, api_key=load_api_key(request.server_url) or None)
    engine.speculation, engine.sampling = request.speculation, request.sampling
    engine.prepare(progress)
    info = EngineInfo(
        target=engine.model_name or request.server_url,
        draft="the server's own",
        device=request.server_url,
        quantization="none",
        notices=tuple(engine.notices),
    )
    return engine, info


class LoadCancelled(Exception):
    pass


def _emit_while_alive(signal) -> Callable:
    """signal.emit for the engine's own threads, which may outlive the window: once Qt has deleted the
    worker (the window closed while the engine optimized in the background) there is nobody to tell."""

    def emit(*args) -> None:
        with contextlib.suppress(RuntimeError):  # "Signal source has been deleted"
            signal.emit(*args)

    return emit


class EngineWorker(QObject):
    """Lives on the worker thread. Every slot runs there; every signal is received on the GUI thread."""

    progress = Signal(str, int, int)
    loaded = Signal(object)  # EngineInfo
    load_failed = Signal(str, str)  # message for the user, details
    load_cancelled = Signal()
    piece = Signal(object)  # TextPiece
    round_stats = Signal(object)  # GenerationStats, a copy the GUI may keep
    finished = Signal(object)  # Finished
    failed = Signal(str, str)  # message for the user, details
    # the engine's background optimization (ChatEngine.optimize_in_background), from its own thread
    optimizing = Signal(str, int, int)
    optimized = Signal(str)  # how it ended, for the user

    def __init__(self, factory: EngineFactory):
        super().__init__()
        self._factory = factory
        self._engine = None

    @Slot(object, object)
    def load(self, request: LoadRequest, cancel: threading.Event) -> None:
        def progress(stage: str, done: int, total: int) -> None:
            if cancel.is_set():
                raise LoadCancelled
            self.progress.emit(stage, done, total)

        try:
            progress("Loading models", 0, 0)
            engine, info = self._factory(request, progress)
            if cancel.is_set():
                raise LoadCancelled
        except LoadCancelled:
            self.load_cancelled.emit()
            return
        except TandemError as exc:
            self.load_failed.emit(str(exc), traceback.format_exc())
            return
        except Exception as exc:  # a bug or an unexpected library failure: shown, never a crash
            self.load_failed.emit(f"Could not load the models: {exc}", traceback.format_exc())
            return
        self._engine = engine
        self.loaded.emit(info)
        self._build_tree_graph(engine)
        start = getattr(engine, "optimize_in_background", None)
        if start is not None:
            start(_emit_while_alive(self.optimizing), _emit_while_alive(self.optimized))

    def _build_tree_graph(self, engine) -> None:
        """The token-tree graph that prepare left (tree_graph_later), after "Ready" and on this thread
        (dynamo traces it five times slower on another): a reply asked for meanwhile waits seconds."""
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

    @Slot(object, object)
    def apply_settings(self, speculation: SpeculationSettings, sampling: SamplingSettings) -> None:
        # Queued behind any running reply, so the engine never sees settings change mid-generation.
        if self._engine is not None:
            self._engine.speculation = speculation
            self._engine.sampling = sampling

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


@dataclass
class _StopFlags:
    generation: threading.Event = field(default_factory=threading.Event)
    load: threading.Event = field(default_factory=threading.Event)


def _stop_thread(thread: QThread, stops: _StopFlags, *_args, timeout_ms: int = 15000) -> bool:
    """timeout_ms < 0 waits as long as it takes."""
    stops.generation.set()
    stops.load.set()
    thread.quit()
    return thread.wait() if timeout_ms < 0 else thread.wait(timeout_ms)


class EngineBridge(QObject):
    """The GUI side: owns the worker thread, starts work on it, and stops it."""

    _load_requested = Signal(object, object)
    _respond_requested = Signal(object, object)
    _settings_requested = Signal(object, object)

    def __init__(self, factory: EngineFactory = default_engine_factory, parent: QObject | None = None):
        super().__init__(parent)
        # A child of the bridge, and stopped when the bridge is destroyed (destroyed is emitted before
        # children are deleted): a window dropped without closing must not destroy a running QThread.
        self._thread = QThread(self)
        self._thread.setObjectName("tandem-engine")
        self._stops = _StopFlags()
        self.destroyed.connect(functools.partial(_stop_thread, self._thread, self._stops))
        self.worker = EngineWorker(factory)
        self.worker.moveToThread(self._thread)
        self._thread.finished.connect(self.worker.deleteLater)
        self._load_requested.connect(self.worker.load)
        self._respond_requested.connect(self.worker.respond)
        self._settings_requested.connect(self.worker.apply_settings)
        self.worker.loaded.connect(self._on_loaded)
        self.info: EngineInfo | None = None  # the engine that answers; kept when a new load fails
        self._thread.start()
        self.probes = Probes(self)

    def load(self, request: LoadRequest) -> None:
        self._stops.load = threading.Event()
        self._load_requested.emit(request, self._stops.load)

    def cancel_load(self) -> None:
        self._stops.load.set()

    def respond(self, messages: list[dict]) -> None:
        self._stops.generation = threading.Event()
        self._respond_requested.emit(messages, self._stops.generation)

    def stop(self) -> None:
        self._stops.generation.set()

    def apply_settings(self, speculation: SpeculationSettings, sampling: SamplingSettings) -> None:
        self._settings_requested.emit(speculation, sampling)

    def shutdown(self, timeout_ms: int = 15000) -> bool:
        """Stop any work, end the threads; True when they ended in time."""
        self.probes.shutdown(timeout_ms)
        return _stop_thread(self._thread, self._stops, timeout_ms=timeout_ms)

    @Slot(object)
    def _on_loaded(self, info: EngineInfo) -> None:
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
