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
    """Load the target, then the draft.

    draft_spec None means "a quantized copy of the target" (a draft for a float target only: a target
    that rounds its activations, such as a GGUF file on its own blocks, gets none); NO_DRAFT loads no
    draft model; its `quantization` "auto" picks one for the target
    (engine.models.quantize.draft_quantization_for; another draft model takes INT8). 'ngram' and
    'none' load no draft model. target_precision (fp32, bf16, int8, int4; None: the device's default
    dtype) is the precision whose output Tandem reproduces.
    """
    from engine.models.compat import check_compatible

    target = load_model(
        target_spec, device=device, dtype=dtype, progress=progress, precision=target_precision
    )
    if draft_spec is not None and draft_spec.lower() == NO_DRAFT:
        return target, None
    from engine.models.quantize import draft_quantization_for

    source = target_spec if draft_spec is None else draft_spec
    if source == target_spec and target.rounds_activations:
        return target, None  # a quantized copy of a target that is already quantized saves nothing
    draft_device = draft_device or device
    if quantization == "auto":
        quantization = draft_quantization_for(target, "auto") if source == target_spec else "int8"
    draft = load_model(source, device=draft_device, dtype=dtype, progress=progress, quantization=quantization)
    if source != target_spec:
        check_compatible(target.tokenizer, draft.tokenizer, target.model.config, draft.model.config)
    return target, draft
