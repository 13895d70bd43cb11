"""Quick look-ups the settings and model manager run before anything is loaded.

Can this draft serve this target, will the pair fit in memory, which devices does torch see, what
does a quantization mode cost here. Each is a plain function that may take a second (reading a
tokenizer, importing torch); the app runs them on its worker thread. This module imports neither
torch nor transformers at import time, so the GUI thread may import it.

A probe never downloads: a hub id that is not in the local cache is answered with "not on disk yet".
Local specs go through `loading.resolve_folder`, the same path loading takes; a built-in model or a
GGUF file gives the config and tokenizer read from its metadata (once, as loading it on a CPU does),
and its weights are never converted for a probe. The compatibility verdict is always
`engine.models.compat`; the catalogue's tokenizer families only stand in while a model is not on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.models.builtin import BUILTIN_MODELS, BUILTIN_PREFIX

NOT_ON_DISK = "Not on disk yet: the tokenizers are compared after the download."


def model_folder(spec: str) -> Path | None:
    """The model's local folder, or None for a hub model not in the cache. Raises for a bad path."""
    from engine.models.gguf_hub import is_hub_gguf_spec
    from engine.models.loading import resolve_folder
    from engine.models.source import parse_source

    source = parse_source(spec)  # a hub GGUF file already downloaded is a .gguf source
    if source.kind == "hub":
        if is_hub_gguf_spec(spec):
            return None  # downloaded when the models load
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(spec, "config.json")
        return Path(cached).parent if isinstance(cached, str) else None
    if source.is_gguf:  # its config and tokenizer, without converting the weights
        from engine.models.loading import gguf_metadata

        return gguf_metadata(spec)
    return resolve_folder(source)


def tokenizer_of(spec: str):
    """The model's tokenizer alone, or None when it is not on disk."""
    from engine.models.loading import load_tokenizer

    folder = model_folder(spec)
    return None if folder is None else load_tokenizer(folder)


def config_of(spec: str):
    """The model's config without weights, or None when it is not on disk."""
    from engine.models.loading import load_config

    folder = model_folder(spec)
    return None if folder is None else load_config(str(folder))


def check_target(spec: str) -> str:
    """'' when the target can be loaded as far as can be told without loading it; raises TandemError
    (ModelNotFoundError, ModelFormatError) with the reason otherwise."""
    from engine.models.loading import check_model_folder, spec_kind

    folder = model_folder(spec)
    if folder is None:
        return "Downloaded from the Hugging Face hub when the models load."
    if spec_kind(spec) not in ("builtin", "gguf"):  # a GGUF's weights are its file, read above
        check_model_folder(folder)
    return ""


def check_draft(target: str, draft: str, cache: dict[str, Any] | None = None) -> tuple[bool | None, str]:
    """(ok, reason) for a draft; ok is None when neither tokenizer nor catalogue can tell yet.

    `cache` keeps (tokenizer, config) per spec between calls; it must be used by one thread only.
    """
    from engine.models import catalog
    from engine.models.compat import compatibility

    cache = {} if cache is None else cache
    for spec in (target, draft):
        if spec not in cache:
            tokenizer = tokenizer_of(spec)
            cache[spec] = (tokenizer, config_of(spec) if tokenizer is not None else None)
    (target_tokenizer, target_config), (draft_tokenizer, draft_config) = cache[target], cache[draft]
    if target_tokenizer is not None and draft_tokenizer is not None:
        return compatibility(target_tokenizer, draft_tokenizer, target_config, draft_config)
    entries = catalog.catalogue_entries()
    target_entry, draft_entry = catalog.find_entry(target, entries), catalog.find_entry(draft, entries)
    if target_entry.family is None or draft_entry.family is None:
        return None, NOT_ON_DISK
    ok, reason = catalog.can_draft(target_entry, draft_entry)
    return ok, (f"{reason[0].upper()}{reason[1:]}; checked again when loading." if ok else reason)


def memory_line(
    target: str,
    draft: str | None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    draft_on_cpu: bool = False,
    draft_quantization: str = "none",
    target_quantization: str = "none",
    target_precision: str = "default",
    context: int | None = None,
) -> str:
    """The memory estimate for a pair in one line, or why it cannot be made yet. A GGUF target run on
    its own blocks weighs its file, and a quantized copy of it is no draft (engine.models.pair). Its KV
    caches hold `context` tokens (None: the default), never more than the target's own context."""
    from engine.models.loading import native_gguf_file
    from engine.models.memory import estimate_memory
    from engine.settings import cache_tokens_for

    target_config = config_of(target)
    if target_config is None:
        return "Memory estimate available once the target is downloaded."
    precision = None if target_precision == "default" else target_precision
    native = native_gguf_file(target, device, dtype, precision, target_quantization)
    if native is not None and draft == target:
        draft = None
    draft_config = None
    if draft is not None:
        draft_config = config_of(draft)
        if draft_config is None:
            return "Memory estimate available once the draft is downloaded."
    estimate = estimate_memory(
        target_config,
        draft_config,
        context_length=cache_tokens_for(target_config, context),
        device=device,
        draft_device="cpu" if draft_on_cpu else None,
        target_dtype=dtype,
        draft_dtype=dtype,
        target_quantization=target_quantization,
        draft_quantization=draft_quantization,
        target_weight_bytes=native.stat().st_size if native is not None else None,
    )
    return estimate.summary


def quantization_line(mode: str, device: str) -> str:
    """What a quantization mode costs and saves on this device, in one line."""
    from engine.models.loaded import resolve_device
    from engine.models.quantize import quantization_note

    return quantization_note(mode, resolve_device(device))


def precision_line(precision: str, device: str) -> str:
    """What a target precision costs here and what 'lossless' then means, in one line."""
    from engine.models.loaded import resolve_device
    from engine.models.quantize import precision_note

    return "" if precision == "default" else precision_note(precision, resolve_device(device))


def devices() -> tuple[tuple[str, ...], str]:
    """(the devices to offer, a note on what is missing). 'cuda' only when torch sees a GPU."""
    import torch

    if torch.cuda.is_available():
        return ("auto", "cpu", "cuda"), f"GPU: {torch.cuda.get_device_name(0)}."
    built = "with" if torch.backends.cuda.is_built() else "without"
    return ("auto", "cpu"), f"No CUDA GPU found (torch {torch.__version__}, built {built} CUDA): CPU only."


def builtin_specs() -> list[str]:
    return [BUILTIN_PREFIX + name for name in BUILTIN_MODELS]


def known_specs() -> list[str]:
    """Built-in models first, then everything the catalogue lists or finds on disk, without repeats."""
    from engine.models import catalog

    specs = builtin_specs()
    for entry in catalog.list_models():
        if entry.spec not in specs:
            specs.append(entry.spec)
    return specs
