"""Quantized linear kernels, each a real code path that can replace a model's nn.Linear layers.

A kernel is named `<mode>-<family>[-<variant>]`, for example `int8-dynamic-fbgemm` or
`int4-weight-g32`. Every kernel quantizes the LM head too (it is untied from the embedding, which
stays a float gather). Whether a kernel is *right* on this machine is not assumed here: the check in
engine.kernels.quant_check compares its logits with the float model before it is used.

Families:
- dynamic INT8 (`torch.ops.quantized.linear_dynamic` under one quantized engine): INT8 weights with a
  scale per output channel; activations quantized on each call with one scale for the call's input.
  Activation outliers are smoothed into the weights first (SmoothQuant, arXiv 2211.10438): input
  channel j is divided by s_j and weight column j multiplied by s_j, s_j = max|x_j|^a / max|w_j|^(1-a),
  measured on the check's probe text (engine.kernels.quant_check), in the same forward that gives the
  float logits. `-plain` is torch.ao's stock `quantize_dynamic`, kept so
  the report can show what it does on this machine.
- block INT8/INT4 (engine.kernels.block_quant): weights in blocks of 32 as in a GGUF's Q8_0 and
  Q4_1, activations quantized per block of 32 on each call, integer dot products (AVX-512 VNNI,
  AVX2 or portable C++ built on first use).
- weight-only INT8: INT8 weights, scale per output channel, float activations.
- weight-only INT4: group-wise asymmetric INT4 (torch's int4pack kernels), w = (q - 8)·scale + zero.
- bitsandbytes (CUDA; NF4 also on CPU): quantizes while loading, see engine.models.quantize.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.cpu_features import has_vnni
from engine.kernels.quant_smoothing import (
    fold_smoothing,
    replace_linears,
    untie_lm_head,
)

QUANTIZED_ENGINES = ("fbgemm", "x86", "onednn", "qnnpack")

# ---- modules ---------------------------------------------------------------------------------


@contextlib.contextmanager
def quantized_engine(name: str) -> Iterator[None]:
    """Pack weights under one quantized engine; the packed weights keep its kernels afterwards."""
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 rows: (q [N, K] int8, scale [N] float32) with weight ≈ q · scale[:, None]."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-8)  # [N]
    q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)  # [N, K]
    return q, scale


class DynamicInt8Linear(nn.Module):
    """INT8 weights (per output channel) packed for one quantized engine; activations quantized per call.

    The engine quantizes a call's whole input with one scale. One token per call (decoding) is thus
    per-token quantization; for several tokens each row is first divided by its own max |x|, so the
    scale stays per token there too. `inverse_scale` ([K]) is the smoothing: the weight columns were
    multiplied by s, so the input channels are divided by it.
    """

    compilable = False  # the packed weights are an opaque object inductor cannot trace

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        engine: str,
        reduce_range: bool,
        inverse_scale: torch.Tensor | None = None,
    ):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.engine, self.reduce_range = engine, reduce_range
        q, scale = int8_per_channel(weight)
        zero_points = torch.zeros_like(scale, dtype=torch.long)
        with warnings.catch_warnings(), quantized_engine(engine):
            warnings.simplefilter("ignore")  # torch's deprecation notice for quantized tensors
            qweight = torch._make_per_channel_quantized_tensor(q, scale.double(), zero_points, 0)
            self._packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.register_buffer("inverse_scale", inverse_scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.packed_bytes = q.numel() + scale.numel() * 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inverse_scale is not None:
            x = x * self.inverse_scale
        if x.numel() == self.in_features:
            y = torch.ops.quantized.linear_dynamic(x, self._packed, self.reduce_range)
        else:
            rows = x.abs().amax(-1, keepdim=True).clamp(min=1e-6)  # [..., 1]
            y = torch.ops.quantized.linear_dynamic(x / rows, self._packed, self.reduce_range) * rows
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        smoothed = self.inverse_scale is not None
        return (
            f"{self.in_features}, {self.out_features}, engine={self.engine}, "
            f"reduce_range={self.reduce_range}, smoothed={smoothed}"
        )


class Int8WeightOnlyLinear(nn.Module):
    """INT8 weights with a float scale per output channel; the matmul runs in the activation dtype.

    impl "int8pack" is torch._weight_int8pack_mm (gpt-fast's CPU int8 kernel); "dequant" is F.linear on
    the weight converted back to float, then the row scales.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, impl: str = "dequant"):
        super().__init__()
        self.in_features, self.out_features, self.impl = weight.shape[1], weight.shape[0], impl
        q, scale = int8_per_channel(weight)
        self.register_buffer("weight_int8", q)  # [N, K]
        self.register_buffer("scale", scale.to(weight.dtype))  # [N]
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # [M, K]
        if self.impl == "int8pack":
            y = torch._weight_int8pack_mm(x2, self.weight_int8, self.scale.to(x.dtype))
        else:
            y = F.linear(x2, self.weight_int8.to(x.dtype)) * self.scale.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features)


class Int4WeightOnlyLinear(nn.Module):
    """Group-wise asymmetric INT4 weights in torch's int4pack layout (CPU or CUDA kernel)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group_size: int):
        super().__init__()
        n, k = weight.shape
        self.in_features, self.out_features, self.group_size = k, n, group_size
        device = weight.device
        groups = weight.detach().float().view(n, k // group_size, group_size)
        low = groups.amin(-1, keepdim=True)
        high = groups.amax(-1, keepdim=True)
        scale = ((high - low) / 15).clamp(min=1e-8)
        q = torch.round((groups - low) / scale).clamp(0, 15).to(torch.int32).view(n, k)  # [N, K] 0..15
        zero = low + 8 * scale  # w = (q - 8) * scale + zero
        # [K / group, N, 2]: scale and zero for each group of each output channel
        scales_and_zeros = torch.cat([scale, zero], -1).transpose(0, 1).contiguous()
        self.on_cuda = device.type == "cuda"
        if self.on_cuda:
            packed_q = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
            packed = torch._convert_weight_to_int4pack(packed_q, 8)  # inner k tiles
            scales_and_zeros = scales_and_zeros.to(torch.bfloat16)
        else:
            packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        self.register_buffer("weight_int4", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # [M, K]
        if self.on_cuda:
            y = torch._weight_int4pack_mm(
                x2.to(torch.bfloat16), self.weight_int4, self.group_size, self.scales_and_zeros
            )
        else:
            y = torch._weight_int4pack_mm_for_cpu(
                x2, self.weight_int4, self.group_size, self.scales_and_zeros.to(x.dtype)
            )
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features)


# ---- the kernel list -------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    """One way to quantize a model's linear layers. `build` replaces them in place."""

    name: str
    mode: str  # "int8" or "int4"
    device_type: str  # "cpu" or "cuda"
    summary: str
    make_linear: Callable[[torch.Tensor, torch.Tensor | None], nn.Module] | None = None
    smooth: bool = False
    load_time: bool = False  # bitsandbytes: quantizes while loading, not here
    version: int = 1  # bump when the numerics of a kernel change, so cached checks are redone
    make_head: Callable | None = None  # the LM head's own kernel, where it differs from the layers'
    # Activations rounded to integers on each call: a verify forward and a one-token step can round a
    # value on either side and pick different tokens, so such a target is not drafted for.
    rounds_activations: bool = False
    # Its layers run on the fused, compiled fast path, each verify row alike whatever their number
    # (engine.kernels.block_quant), where other CPU kernels leave the forward eager and unfused.
    fast_path: bool = False

    def unavailable_reason(self) -> str | None:
        return _unavailable_reason(self)

    def build(self, model: nn.Module, input_maxima: dict[str, torch.Tensor] | None = None) -> nn.Module:
        """Quantize `model` in place (the LM head untied and quantized, the embedding kept float).

        `input_maxima` (from input_channel_maxima on the float model) sets the smoothing scales.
        """
        if self.load_time:
            raise ValueError(f"{self.name} quantizes while loading")
        if self.make_linear is None:
            return _torch_ao_dynamic(model)
        untie_lm_head(model)
        scales = fold_smoothing(model, input_maxima) if self.smooth and input_maxima else {}
        make = self.make_linear
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if self.make_head is not None and head is not None:
            head_ptr, make_layer, make_head = head.weight.data_ptr(), self.make_linear, self.make_head

            def make(weight, bias, *rest):
                return (make_head if weight.data_ptr() == head_ptr else make_layer)(weight, bias, *rest)

        replace_linears(model, make, scales)
        return model


def _dynamic(engine: str) -> Callable:
    # Without VNNI, fbgemm's u8·s8 products saturate in 16 bits unless activations use 7 bits.
    return lambda weight, bias, inverse_scale=None: DynamicInt8Linear(
        weight, bias, engine, not has_vnni() and engine in ("fbgemm", "x86"), inverse_scale
    )


def _block(bits: int) -> Callable:
    def make(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
        from engine.kernels import block_quant

        error = block_quant.build_error()
        if error is not None:
            raise RuntimeError(error)
        if weight.shape[1] % block_quant.PAIR:  # such a layer stays float
            layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
            with torch.no_grad():
                layer.weight.copy_(weight)
                if bias is not None:
                    layer.bias.copy_(bias)
            return layer
        return block_quant.BlockQuantLinear.quantized(weight, bias, bits)

    return make


def _kernels() -> dict[str, Kernel]:
    kernels = [
        Kernel(
            f"int8-dynamic-{engine}",
            "int8",
            "cpu",
            f"dynamic INT8 ({engine} engine), outliers smoothed into the weights",
            _dynamic(engine),
            smooth=True,
            rounds_activations=True,
        )
        for engine in QUANTIZED_ENGINES
    ]
    kernels += [
        Kernel(
            "int8-dynamic-plain",
            "int8",
            "cpu",
            "torch.ao quantize_dynamic, per-tensor weights, no smoothing",
            rounds_activations=True,
        ),
        Kernel(
            "int8-weight",
            "int8",
            "cpu",
            "weight-only INT8 (F.linear on dequantized rows)",
            lambda w, b: Int8WeightOnlyLinear(w, b, "dequant"),
        ),
        Kernel(
            "int8-weight-int8pack",
            "int8",
            "cpu",
            "weight-only INT8 (torch._weight_int8pack_mm)",
            lambda w, b: Int8WeightOnlyLinear(w, b, "int8pack"),
        ),
        Kernel(
            "int8-block-q8_0",
            "int8",
            "cpu",
            "INT8 blocks of 32 (as GGUF Q8_0), activations in INT8 blocks, integer dot products",
            _block(8),
            rounds_activations=True,
            fast_path=True,
        ),
        Kernel(
            "int4-block-q4_1",
            "int4",
            "cpu",
            "INT4 blocks of 32 with scale and offset (as GGUF Q4_1; the LM head in INT8 blocks, as "
            "Q4_1 files keep it), activations in INT8 blocks, integer dot products",
            _block(4),
            make_head=_block(8),
            rounds_activations=True,
            fast_path=True,
        ),
        Kernel(
            "int4-weight-g32",
            "int4",
            "cpu",
            "weight-only INT4, groups of 32 (torch._weight_int4pack_mm_for_cpu)",
            lambda w, b: Int4WeightOnlyLinear(w, b, 32),
        ),
        Kernel("int4-nf4-bnb", "int4", "cpu", "bitsandbytes NF4 on the CPU backend", load_time=True),
        Kernel("int8-bnb", "int8", "cuda", "bitsandbytes LLM.int8", load_time=True, rounds_activations=True),
        Kernel("int4-nf4-bnb-cuda", "int4", "cuda", "bitsandbytes NF4", load_time=True),
        Kernel(
            "int4-weight-g32-cuda",
            "int4",
            "cuda",
            "weight-only INT4, groups of 32 (torch._weight_int4pack_mm)",
            lambda w, b: Int4WeightOnlyLinear(w, b, 32),
        ),
    ]
    return {kernel.name: kernel for kernel in kernels}


KERNELS = _kernels()


def candidates(mode: str, device_type: str, include_plain: bool = False) -> list[Kernel]:
    """Kernels for a mode on a device type, in the default order of preference (before measuring)."""
    return [
        k
        for k in KERNELS.values()
        if k.mode == mode
        and k.device_type == device_type
        and (include_plain or k.name != "int8-dynamic-plain")
    ]


# ---- machine facts ---------------------------------------------------------------------------


@functools.cache
def _unavailable_reason(kernel: Kernel) -> str | None:
    name = kernel.name
    if kernel.device_type == "cuda" and not torch.cuda.is_available():
        return "needs an NVIDIA GPU"
    if kernel.load_time:
        if kernel.device_type == "cpu":
            return int4_cpu_unavailable_reason()
        try:
            import_bitsandbytes()
        except ImportError:
            return "bitsandbytes is not installed"
        return None
    if name.startswith("int8-dynamic-"):
        engine = name.removeprefix("int8-dynamic-")
        if engine != "plain" and engine not in torch.backends.quantized.supported_engines:
            return f"torch has no {engine} quantized engine here"
    try:  # one small layer through the kernel proves the op exists on this build
        device = "cuda" if kernel.device_type == "cuda" else "cpu"
        # 256 inputs: CUDA's int4pack takes rows of whole 128-wide tiles
        layer = nn.Linear(256, 64, bias=False).to(device)
        kernel.build(nn.Sequential(layer))[0](torch.randn(2, 256, device=device))
    except Exception as exc:  # an op missing from this torch build means "not here"
        return f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:160]}"
    return None


# ---- building --------------------------------------------------------------------------------


def _torch_ao_dynamic(model: nn.Module) -> nn.Module:
    """torch.ao's stock dynamic INT8 of every nn.Linear (the default engine's kernels)."""
    untie_lm_head(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)


# ---- speed -----------------------------------------------------------------------------------


def import_bitsandbytes():
    """bitsandbytes without its import-time warning: on CPUs with AVX-512 BF16 it tries to fetch a
    kernel from the hub and logs when it cannot (offline, or an untrusted repository); its own CPU
    code runs then, which is what is checked here."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    import bitsandbytes

    return bitsandbytes


@functools.lru_cache(maxsize=1)
def int4_cpu_unavailable_reason() -> str | None:
    """None when bitsandbytes can run NF4 on this CPU, otherwise why not."""
    try:
        import_bitsandbytes()
        import bitsandbytes.functional as bnbf
        import torch

        packed, state = bnbf.quantize_4bit(torch.ones(64, 64), quant_type="nf4")
        bnbf.dequantize_4bit(packed, state)
    except Exception as exc:  # any failure in a third-party backend means "not here"
        return f"{exc.__class__.__name__}: {exc}"
    return None
