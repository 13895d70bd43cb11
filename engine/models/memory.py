"""How much memory a target/draft pair needs, estimated from configs before any weight is loaded,
and how much a loaded model really holds."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3
# Below this share of free memory a pair "fits"; up to all of it, it is "tight".
COMFORTABLE_SHARE = 0.85
CUDA_CONTEXT_BYTES = 500 * 1024**2
MIN_RUNTIME_OVERHEAD_BYTES = 64 * 1024**2
NF4_BLOCK = 64
INT4_GROUP = 32  # engine.kernels.quant_kernels' int4-weight-g32


# ---- measured --------------------------------------------------------------------------------


def model_memory_bytes(model) -> int:
    """Bytes of parameters and buffers, counting packed quantized weights and their scales."""
    seen: set[int] = set()
    alive = []  # unpacked tensors are temporaries; holding them keeps their ids unique
    total = 0

    def add(tensor) -> None:
        nonlocal total
        if tensor is None or id(tensor) in seen:
            return
        seen.add(id(tensor))
        alive.append(tensor)
        total += tensor.numel() * tensor.element_size()

    for tensor in (*model.parameters(), *model.buffers()):
        add(tensor)
    for module in model.modules():
        total += getattr(module, "packed_bytes", 0)  # engine.kernels.quant_kernels.DynamicInt8Linear
        packed = getattr(module, "_packed_params", None)
        if packed is not None and hasattr(packed, "_weight_bias"):  # torch dynamic INT8 Linear
            weight, bias = packed._weight_bias()
            add(weight)
            add(bias)
        weight = getattr(module, "weight", None)
        state = getattr(weight, "quant_state", None)  # bitsandbytes NF4
        if state is not None:
            add(getattr(state, "absmax", None))
            nested = getattr(state, "state2", None)
            if nested is not None:
                add(getattr(nested, "absmax", None))
        add(getattr(weight, "SCB", None))  # bitsandbytes LLM.int8 row scales
    return total


def release_freed_memory() -> None:
    """Collects garbage, then hands the C heap's free pages back to the system (glibc's malloc_trim).

    A large temporary that is freed (a tokenizer file's parse: about 200 MB for Gemma 3's 262k-token
    vocabulary) stays in the process's resident memory otherwise, free inside the heap but never
    returned. Where the C library has no malloc_trim (macOS, Windows, musl) only the collection runs."""
    import contextlib
    import ctypes
    import gc
    import sys

    gc.collect()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).malloc_trim(0)


def weight_bytes_from_model(model, dtype) -> int:
    """What a (possibly bitsandbytes-quantized) model's weights would take unquantized at `dtype`."""
    import torch

    element_size = torch.empty((), dtype=dtype).element_size()
    total = 0
    for tensor in (*model.parameters(), *model.buffers()):
        state = getattr(tensor, "quant_state", None)
        numel = int(torch.Size(state.shape).numel()) if state is not None else tensor.numel()
        size = (
            element_size
            if tensor.is_floating_point() or state is not None or tensor.dtype == torch.int8
            else tensor.element_size()
        )
        total += numel * size
    return total


# ---- estimated -------------------------------------------------------------------------------


def _meta_model(config):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def estimate_weight_bytes(
    config, quantization: str = "none", dtype: Any = "float32", device: str = "cpu"
) -> int:
    """Weight bytes of a model built from `config`, without loading weights (a meta-device model).

    CPU kernels (engine.kernels.quant_kernels) quantize every Linear, lm_head included (a tied
    embedding keeps its float copy); bitsandbytes on CUDA leaves lm_head unquantized.
    """
    import torch
    from torch import nn

    from engine.models.loaded import resolve_dtype

    torch_device = torch.device(device)
    element_size = torch.empty((), dtype=resolve_dtype(dtype, torch_device)).element_size()
    model = _meta_model(config)
    on_cpu = torch_device.type == "cpu"
    head = model.get_output_embeddings()

    quantized: dict[int, nn.Linear] = {}
    if quantization != "none":
        for module in model.modules():
            if isinstance(module, nn.Linear) and (on_cpu or module is not head):
                quantized[id(module.weight)] = module
    owned_elsewhere = {
        id(p) for m in model.modules() if not isinstance(m, nn.Linear) for p in m.parameters(recurse=False)
    }

    total = 0
    for param in model.parameters():
        linear = quantized.get(id(param))
        if linear is None or id(param) in owned_elsewhere:
            total += param.numel() * element_size
        if linear is not None:
            total += _quantized_linear_bytes(linear, quantization, on_cpu, element_size)
    for buffer in model.buffers():
        total += buffer.numel() * buffer.element_size()
    return total


def _quantized_linear_bytes(linear, quantization: str, on_cpu: bool, element_size: int) -> int:
    rows, numel = linear.weight.shape[0], linear.weight.numel()
    bias = 0 if linear.bias is None else linear.bias.numel() * element_size
    columns = linear.weight.shape[1]
    if quantization == "int8" and on_cpu:
        return numel + rows * 4 + columns * element_size + bias  # row scales, smoothing scales
    if quantization == "int8":
        return numel + rows * 4 + bias  # fp32 scale per row
    if on_cpu:
        return numel // 2 + (numel // INT4_GROUP) * 2 * element_size + bias  # scale and zero per group
    return numel // 2 + (numel // NF4_BLOCK) * 4 + bias  # fp32 absmax per block


def kv_cache_bytes(config, context_length: int, dtype: Any = "float32", device: str = "cpu") -> int:
    """2 (K and V) x layers x kv_heads x head_dim x context x bytes per element."""
    import torch

    from engine.models.loaded import resolve_dtype

    config = getattr(config, "text_config", None) or config
    element_size = torch.empty((), dtype=resolve_dtype(dtype, torch.device(device))).element_size()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * context_length * element_size


def kv_dtype_on(device: str, model_dtype: Any, gguf_blocks: bool) -> Any:
    """The KV cache's dtype on `device`: float16 for a GGUF file run on its own blocks on a CPU (the
    fast path's row kernel reads it: engine.runtime.kv_cache), the model's own elsewhere."""
    return "float16" if gguf_blocks and str(device).startswith("cpu") else model_dtype


def available_memory_bytes(device: str = "cpu") -> int:
    """Free GPU memory (CUDA) or MemAvailable from /proc/meminfo (CPU)."""
    import torch

    torch_device = torch.device(device)
    if torch_device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(torch_device)
        return int(free)
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


@dataclass
class MemoryEstimate:
    parts: dict[str, int]  # label -> bytes
    devices: dict[str, str]  # label -> device it lives on
    available: dict[str, int] = field(default_factory=dict)  # device -> free bytes
    context_length: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(self.parts.values())

    def needed_on(self, device: str) -> int:
        return sum(b for label, b in self.parts.items() if self.devices[label] == device)

    @property
    def verdict(self) -> str:
        """'fits', 'tight' or "won't fit", for the fullest device."""
        worst = "fits"
        for device, free in self.available.items():
            needed = self.needed_on(device)
            if needed > free:
                return "won't fit"
            if needed > COMFORTABLE_SHARE * free:
                worst = "tight"
        return worst

    @property
    def summary(self) -> str:
        free = ", ".join(f"{_gib(b)} free on {d}" for d, b in self.available.items())
        return (
            f"Needs about {_gib(self.total_bytes)} at {self.context_length:,} tokens of context "
            f"({free}): {self.verdict}."
        )


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n < 10 * GIB else f"{n / GIB:.1f} GiB"


def estimate_memory(
    target_config,
    draft_config=None,
    *,
    context_length: int | None = None,
    device: str = "cpu",
    draft_device: str | None = None,
    target_dtype: Any = "auto",
    draft_dtype: Any = "auto",
    target_quantization: str = "none",
    draft_quantization: str = "none",
    available: dict[str, int] | None = None,
    target_weight_bytes: int | None = None,
) -> MemoryEstimate:
    """Weights and KV caches of both models against free memory, from configs alone; at
    `context_length` tokens, by default the context the engine gives the target (cache_tokens_for).
    `target_weight_bytes`: the target's weights where they are known (a GGUF file run as it is)."""
    from engine.models.loaded import resolve_device
    from engine.settings import cache_tokens_for

    if context_length is None:
        context_length = cache_tokens_for(target_config)

    # an estimate may be for a GPU this machine lacks: the caller passes what is available there
    must_exist = available is None
    device = str(resolve_device(device, must_exist))
    draft_device = str(resolve_device(draft_device, must_exist)) if draft_device else device
    parts: dict[str, int] = {}
    devices: dict[str, str] = {}
    if draft_quantization == "auto":  # INT4 or INT8 once the target's weights are read: the larger
        draft_quantization = "int8"

    def add(label: str, nbytes: int, where: str) -> None:
        parts[label] = nbytes
        devices[label] = where

    target_weight_bytes_given = target_weight_bytes is not None  # a GGUF file run on its own blocks
    if target_weight_bytes is None:
        target_weight_bytes = estimate_weight_bytes(target_config, target_quantization, target_dtype, device)
    add("target weights", target_weight_bytes, device)
    add(
        "target KV cache",
        kv_cache_bytes(
            target_config,
            context_length,
            kv_dtype_on(device, target_dtype, target_weight_bytes_given),
            device,
        ),
        device,
    )
    if draft_config is not None:
        add(
            "draft weights",
            estimate_weight_bytes(draft_config, draft_quantization, draft_dtype, draft_device),
            draft_device,
        )
        add(
            "draft KV cache",
            kv_cache_bytes(
                draft_config, context_length, kv_dtype_on(draft_device, draft_dtype, False), draft_device
            ),
            draft_device,
        )
    for where in sorted(set(devices.values())):
        weights = sum(b for label, b in parts.items() if devices[label] == where and "weights" in label)
        overhead = max(MIN_RUNTIME_OVERHEAD_BYTES, weights // 20)
        if where.startswith("cuda"):
            overhead += CUDA_CONTEXT_BYTES
        add(f"runtime overhead ({where})", overhead, where)
    if available is None:
        available = {where: available_memory_bytes(where) for where in sorted(set(devices.values()))}
    return MemoryEstimate(parts, devices, available, context_length)
