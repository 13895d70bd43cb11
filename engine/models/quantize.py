"""Quantized drafts: "none", "int8" or "int4".

On CUDA both use bitsandbytes at load time (LLM.int8, and NF4 computing in bf16/fp16).
On CPU, INT8 is torch's dynamic quantization of every nn.Linear (fbgemm kernels, faster than fp32);
INT4 is bitsandbytes NF4 on the CPU backend, which saves memory but runs slower than fp32.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from engine.errors import SettingsError

QUANTIZATION_MODES = ("none", "int8", "int4")


def validate_mode(mode: str) -> None:
    if mode not in QUANTIZATION_MODES:
        raise SettingsError(f"Unknown quantization '{mode}': choose none, int8 or int4.")


@functools.lru_cache(maxsize=1)
def int4_cpu_unavailable_reason() -> str | None:
    """None when bitsandbytes can run NF4 on this CPU, otherwise why not."""
    try:
        import bitsandbytes.functional as bnbf
        import torch

        packed, state = bnbf.quantize_4bit(torch.ones(64, 64), quant_type="nf4")
        bnbf.dequantize_4bit(packed, state)
    except Exception as exc:  # any failure in a third-party backend means "not here"
        return f"{exc.__class__.__name__}: {exc}"
    return None


def quantization_note(mode: str, device) -> str:
    """A one-line note for the settings panel about what this mode costs and saves here."""
    validate_mode(mode)
    on_cuda = getattr(device, "type", device) == "cuda"
    if mode == "none":
        return ""
    if on_cuda:
        if mode == "int8":
            return "INT8 (bitsandbytes LLM.int8) halves memory but is often slower per token than bf16."
        return "INT4 (bitsandbytes NF4) uses about a quarter of bf16 memory; speed is close to bf16."
    if mode == "int8":
        return "INT8 (dynamic) is faster than fp32 on this CPU and needs less memory."
    reason = int4_cpu_unavailable_reason()
    if reason is not None:
        return f"INT4 is unavailable on this CPU ({reason})."
    return "INT4 saves memory but is slower on this CPU."


def load_time_quantization(mode: str, device, dtype) -> dict[str, Any]:
    """Extra from_pretrained arguments for quantizing while loading; empty when done afterwards."""
    from transformers import BitsAndBytesConfig

    if mode == "none" or (mode == "int8" and device.type == "cpu"):
        return {}
    if mode == "int8":
        config = BitsAndBytesConfig(load_in_8bit=True)
    else:
        if device.type == "cpu" and int4_cpu_unavailable_reason() is not None:
            raise SettingsError(quantization_note("int4", device))
        config = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype
        )
    device_map = "cpu" if device.type == "cpu" else {"": device.index or 0}
    return {"quantization_config": config, "device_map": device_map}


def cpu_int8_quantize(model, inplace: bool = True):
    """Dynamic INT8 for every nn.Linear, lm_head included.

    With tied embeddings the head gets its own INT8 copy and the input embedding stays float,
    so the tie is broken on purpose, not corrupted.
    """
    import torch
    from torch import nn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=inplace)


def quantize_model(loaded, mode: str):
    """A quantized copy of a loaded model, leaving the original untouched.

    CPU INT8 quantizes the weights in memory; bitsandbytes modes reload from the model's folder.
    """
    from engine.models.loaded import LoadedModel
    from engine.models.loading import load_model
    from engine.models.memory import model_memory_bytes

    validate_mode(mode)
    if mode == loaded.quantization:
        return loaded
    if loaded.quantization != "none":
        raise SettingsError("Quantize from the unquantized model, not from an already quantized one.")
    if mode == "int8" and loaded.device.type == "cpu":
        model = cpu_int8_quantize(loaded.model, inplace=False).eval()
        info = dict(loaded.info)
        info.update(
            memory_bytes_before=model_memory_bytes(loaded.model),
            memory_bytes=model_memory_bytes(model),
            quantization_note=quantization_note(mode, loaded.device),
        )
        return LoadedModel(
            loaded.spec, model, loaded.tokenizer, loaded.device, loaded.dtype, mode, loaded.path, info
        )
    if loaded.path is None:
        raise SettingsError(
            f"{mode.upper()} quantizes while loading, and this model has no folder to reload from."
        )
    quantized = load_model(str(loaded.path), device=str(loaded.device), dtype=loaded.dtype, quantization=mode)
    quantized.spec = loaded.spec
    return quantized
