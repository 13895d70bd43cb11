"""What the app loads: a LoadRequest (the part of the config that needs a load to change) turned into an
engine and the EngineInfo the window shows. The factories run on the bridge's loader thread, never on
the GUI thread: torch and transformers are imported here, lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.events import ProgressCallback
from engine.settings import NO_DRAFT, SamplingSettings, SpeculationSettings, needs_draft_model


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
    # tokens of KV cache the target gets (None: engine.settings.DEFAULT_CONTEXT_TOKENS), never more
    # than its own context; a server keeps its own
    context: int | None = None

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
            context=config.context,
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
    # tokens the target reads, prompt and reply together (ChatEngine.context_length: the context chosen,
    # or the model's own where that is shorter); None: not known
    context_length: int | None = None


# factory(request, progress) -> (engine, info). Runs on the loader thread.
EngineFactory = Callable[[LoadRequest, ProgressCallback], tuple[Any, EngineInfo]]


def default_engine_factory(request: LoadRequest, progress: ProgressCallback) -> tuple[Any, EngineInfo]:
    if request.backend == "server":
        return remote_engine_factory(request, progress)
    from engine.models.pair import load_pair
    from engine.session import ChatEngine

    draft_spec = request.draft if needs_draft_model(request.drafter) else NO_DRAFT
    precision = None if request.target_precision == "default" else request.target_precision
    target, draft = load_pair(
        request.target,
        draft_spec,
        quantization=request.quantization,
        device=request.device,
        dtype=request.dtype,
        progress=progress,
        draft_device="cpu" if request.draft_on_cpu else None,
        target_precision=precision,
    )
    progress("Preparing the engine", 0, 1)
    engine = ChatEngine(
        target,
        draft,
        speculation=request.speculation,
        sampling=request.sampling,
        compiled=request.compiled,
        remember_drafters=True,
        context=request.context,
    )
    engine.tree_graph_later = True  # built after "Ready" (LoaderWorker._build_tree_graph)
    engine.prepare(progress)
    info = EngineInfo(
        target=target.name,
        draft=draft.name if draft is not None else (None if request.drafter == "none" else request.drafter),
        device=str(target.device),
        quantization=draft.quantization if draft is not None else "none",
        notices=tuple(engine.notices),
        kernels=kernel_lines(target, draft),
        context_length=engine.context_length,
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
        context_length=getattr(engine, "context_length", None),
    )
    return engine, info
