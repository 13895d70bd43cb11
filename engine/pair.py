"""Load a target and its draft as one choice: the draft is quantized and checked against the target."""

from __future__ import annotations

from engine.builtin import ProgressCallback
from engine.loading import LoadedModel, load_model

NO_DRAFT_MODEL = {"ngram", "none"}


def load_pair(
    target_spec: str,
    draft_spec: str | None,
    quantization: str = "int8",
    device: str = "auto",
    dtype: str = "auto",
    progress: ProgressCallback | None = None,
    draft_device: str | None = None,
) -> tuple[LoadedModel, LoadedModel | None]:
    """Load the target, then the draft.

    draft_spec None means "a quantized copy of the target", the only same-tokenizer draft for a
    model that ships alone. 'ngram' and 'none' load no draft model.
    """
    from engine.compat import check_compatible
    from engine.quantize import quantize_model

    target = load_model(target_spec, device=device, dtype=dtype, progress=progress)
    if draft_spec is not None and draft_spec.lower() in NO_DRAFT_MODEL:
        return target, None
    draft_device = draft_device or device
    if draft_spec is None or draft_spec == target_spec:
        base = load_model(target_spec, device=draft_device, dtype=dtype, progress=progress)
    else:
        base = load_model(draft_spec, device=draft_device, dtype=dtype, progress=progress)
        check_compatible(target.tokenizer, base.tokenizer, target.model.config, base.model.config)
    draft = quantize_model(base, quantization) if quantization != "none" else base
    return target, draft
