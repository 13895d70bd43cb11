"""Load a target and its draft as one choice: the draft is quantized and checked against the target."""

from __future__ import annotations

from engine.events import ProgressCallback
from engine.models.loaded import LoadedModel
from engine.models.loading import load_model
from engine.settings import NO_DRAFT


def load_pair(
    target_spec: str,
    draft_spec: str | None,
    quantization: str = "auto",
    device: str = "auto",
    dtype: str = "auto",
    progress: ProgressCallback | None = None,
    draft_device: str | None = None,
    target_precision: str | None = None,
) -> tuple[LoadedModel, LoadedModel | None]:
    """Load the target, then the draft, whose plan follows from the target's.

    draft_spec None means "a quantized copy of the target": a draft for a float target only (a
    target that rounds its activations, such as a GGUF file on its own blocks, gets none, since a copy
    of it saves nothing). NO_DRAFT ("none") loads no draft model. A separate draft model that is a
    GGUF file runs in its own blocks where the target runs in its file's (engine.models.plan), and is
    otherwise quantized as `quantization` says ("auto": INT8; for a copy,
    engine.kernels.kernel_choice.copy_mode). target_precision (fp32, bf16, int8, int4; None:
    the device's default) is the precision whose output Tandem reproduces.
    """
    from engine.models.compat import check_compatible
    from engine.models.gguf_hub import resolve_spec as resolve_hub_gguf

    target = load_model(
        target_spec, device=device, dtype=dtype, progress=progress, precision=target_precision
    )
    if draft_spec is not None and draft_spec.lower() == NO_DRAFT:
        return target, None
    copy = draft_spec is None or draft_spec == target_spec
    if copy and target.rounds_activations:
        return target, None
    source = target_spec if copy else resolve_hub_gguf(draft_spec, progress)
    draft = load_model(
        source,
        device=draft_device or device,
        dtype=dtype,
        progress=progress,
        quantization=draft_quantization(target, source, copy, quantization, draft_device or device),
    )
    if not copy:
        check_compatible(target.tokenizer, draft.tokenizer, target.model.config, draft.model.config)
    return target, draft


def draft_quantization(target: LoadedModel, source: str, copy: bool, asked: str, device: str) -> str:
    """The draft's quantization: as asked, or for "auto" the copy's kernel for its target, none for a
    GGUF draft beside a target on its file's blocks (it runs on its own), else INT8."""
    from engine.models.loading import native_gguf_file

    if asked != "auto" or copy:  # a copy's "auto" is resolved as it is quantized
        return asked
    if target.quantization == "gguf" and native_gguf_file(source, device) is not None:
        return "none"
    return "int8"
