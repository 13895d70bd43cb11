"""Quantized linear kernels, each a real code path that can replace a model's nn.Linear layers.

A kernel is named `<mode>-<family>[-<variant>]`, for example `int8-dynamic-fbgemm` or
`int4-weight-g32`. Every kernel quantizes the LM head too (it is untied from the embedding, which
stays a float gather). Whether a kernel is *right* on this machine is not assumed here: the check in
engine.models.quant_check compares its logits with the float model before it is used.

Families:
- dynamic INT8 (`torch.ops.quantized.linear_dynamic` under one quantized engine): INT8 weights with a
  scale per output channel; activations quantized on each call with one scale for the call's input.
  Activation outliers are smoothed into the weights first (SmoothQuant, arXiv 2211.10438): input
  channel j is divided by s_j and weight column j multiplied by s_j, s_j = max|x_j|^a / max|w_j|^(1-a),
  measured on the check's probe text (engine.models.quant_check), in the same forward that gives the
  float logits. `-plain` is torch.ao's stock `quantize_dynamic`, kept so
  the report can show what it does on this machine.
- weight-only INT8: INT8 weights, scale per output channel, float activations.
- weight-only INT4: group-wise asymmetric INT4 (torch's int4pack kernels), w = (q - 8)·scale + zero.
- bitsandbytes (CUDA; NF4 also on CPU): quantizes while loading, see engine.models.quantize.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

SMOOTH_ALPHA = 0.5
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
        replace_linears(model, self.make_linear, scales)
        return model


def _dynamic(engine: str) -> Callable:
    # Without VNNI, fbgemm's u8·s8 products saturate in 16 bits unless activations use 7 bits.
    return lambda weight, bias, inverse_scale=None: DynamicInt8Linear(
        weight, bias, engine, not has_vnni() and engine in ("fbgemm", "x86"), inverse_scale
    )


def _kernels() -> dict[str, Kernel]:
    kernels = [
        Kernel(
            f"int8-dynamic-{engine}",
            "int8",
            "cpu",
            f"dynamic INT8 ({engine} engine), outliers smoothed into the weights",
            _dynamic(engine),
            smooth=True,
        )
        for engine in QUANTIZED_ENGINES
    ]
    kernels += [
        Kernel(
            "int8-dynamic-plain", "int8", "cpu", "torch.ao quantize_dynamic, per-tensor weights, no smoothing"
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
            "int4-weight-g32",
            "int4",
            "cpu",
            "weight-only INT4, groups of 32 (torch._weight_int4pack_mm_for_cpu)",
            lambda w, b: Int4WeightOnlyLinear(w, b, 32),
        ),
        Kernel("int4-nf4-bnb", "int4", "cpu", "bitsandbytes NF4 on the CPU backend", load_time=True),
        Kernel("int8-bnb", "int8", "cuda", "bitsandbytes LLM.int8", load_time=True),
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


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def has_vnni() -> bool:
    return bool({"avx512_vnni", "avx_vnni", "avx_vnni_int8"} & cpu_flags())


def cpu_signature() -> str:
    """The CPU features that decide which kernel paths run: capability level and the SIMD flags."""
    wanted = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma", "sse4", "neon", "asimd")))
    return f"{torch.backends.cpu.get_cpu_capability()}:{','.join(wanted)}"


@functools.cache
def _unavailable_reason(kernel: Kernel) -> str | None:
    name = kernel.name
    if kernel.device_type == "cuda" and not torch.cuda.is_available():
        return "needs an NVIDIA GPU"
    if kernel.load_time:
        from engine.models.quantize import int4_cpu_unavailable_reason

        if kernel.device_type == "cpu":
            return int4_cpu_unavailable_reason()
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            return "bitsandbytes is not installed"
        return None
    if name.startswith("int8-dynamic-"):
        engine = name.removeprefix("int8-dynamic-")
        if engine != "plain" and engine not in torch.backends.quantized.supported_engines:
            return f"torch has no {engine} quantized engine here"
    try:  # one tiny layer through the kernel proves the op exists on this build
        device = "cuda" if kernel.device_type == "cuda" else "cpu"
        layer = nn.Linear(64, 32, bias=False).to(device)
        kernel.build(nn.Sequential(layer))[0](torch.randn(2, 64, device=device))
    except Exception as exc:  # an op missing from this torch build means "not here"
        return f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:160]}"
    return None


# ---- building --------------------------------------------------------------------------------


def untie_lm_head(model: nn.Module) -> None:
    """Give the LM head its own weight so quantizing it leaves the input embedding a float gather."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if head is not None and embed is not None and head.weight is embed.weight:
        head.weight = nn.Parameter(embed.weight.detach().clone(), requires_grad=False)
        if hasattr(model, "config"):
            model.config.tie_word_embeddings = False


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(name, module) for name, module in model.named_modules() if type(module) is nn.Linear]


def replace_linears(model: nn.Module, make: Callable, smoothing: dict[str, torch.Tensor]) -> None:
    """Swap every nn.Linear for make(weight, bias[, inverse_scale]); a layer in `smoothing` (whose
    weight columns were already multiplied by its scales) divides its input by them."""
    for name, linear in linear_layers(model):
        weight = linear.weight.detach()
        scale = smoothing.get(name)
        if scale is None:
            quantized = make(weight, linear.bias)
        else:
            quantized = make(weight, linear.bias, (1 / scale).to(weight.dtype))
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, quantized)


@torch.inference_mode()
def input_channel_maxima(model: nn.Module, inputs: list[torch.Tensor]):
    """Run the float model over `inputs` ([n] ids each), recording max |x_j| at the input of every
    nn.Linear. Returns (name -> [K] maxima, the logits of each input: [n, V] float32)."""
    maxima: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(_module, args, _output):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(0).float()
            maxima[name] = torch.maximum(maxima[name], x) if name in maxima else x

        return record

    handles = [linear.register_forward_hook(hook(name)) for name, linear in linear_layers(model)]
    try:
        logits = [model(input_ids=ids.view(1, -1), use_cache=False).logits[0].float() for ids in inputs]
    finally:
        for handle in handles:
            handle.remove()
    return maxima, logits


def smoothing_scales(model: nn.Module, input_maxima: dict[str, torch.Tensor], alpha: float = SMOOTH_ALPHA):
    """SmoothQuant scales s_j = max|x_j|^alpha / max|w_j|^(1-alpha) per nn.Linear: name -> [K]."""
    scales = {}
    linears = dict(linear_layers(model))
    for name, x_max in input_maxima.items():
        if name not in linears:
            continue
        weight = linears[name].weight.detach()
        w_max = weight.abs().amax(0).float().clamp(min=1e-5)  # [K]
        scale = (x_max.to(w_max.device).clamp(min=1e-5) ** alpha) / (w_max ** (1 - alpha))
        scales[name] = scale.clamp(min=1e-2, max=1e2).to(weight.dtype)
    return scales


# RMSNorms that compute weight * normalized(x), so dividing their weight by s divides their output by s.
FOLDABLE_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")


def _scale(x_max: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    w_max = torch.stack([w.detach().abs().amax(0).float() for w in weights]).amax(0).clamp(min=1e-5)  # [K]
    scale = (x_max.to(w_max.device).clamp(min=1e-5) ** alpha) / (w_max ** (1 - alpha))
    return scale.clamp(min=1e-2, max=1e2)


@torch.no_grad()
def fold_smoothing(model: nn.Module, input_maxima: dict[str, torch.Tensor], alpha: float = SMOOTH_ALPHA):
    """Smooth every nn.Linear's input; where the input comes from an RMSNorm (q/k/v, gate/up, the
    LM head) or from up_proj (down_proj), fold 1/s into that module's weight so decoding pays no
    extra op. Weight columns are multiplied by s in place. Returns the scales of the layers left
    to divide their own input (name -> [K])."""
    linears = dict(linear_layers(model))
    folded: set[str] = set()

    def fold(divide: torch.Tensor, names: list[str], rows: bool = False) -> None:
        present = [n for n in names if n in linears and n in input_maxima]
        if len(present) != len(names):
            return
        scale = _scale(input_maxima[names[0]], [linears[n].weight for n in names], alpha)
        # `divide` is a norm's weight [K], or up_proj's weight [K, hidden] whose rows feed down_proj
        divide.div_((scale[:, None] if rows else scale).to(divide.dtype))
        for name in names:
            linears[name].weight.mul_(scale.to(linears[name].weight.dtype))
            folded.add(name)

    for prefix, module in model.named_modules():
        attn, mlp = getattr(module, "self_attn", None), getattr(module, "mlp", None)
        norm = getattr(module, "input_layernorm", None)
        post = getattr(module, "post_attention_layernorm", None)
        if attn is None or mlp is None or norm is None or post is None:
            continue
        if type(norm).__name__ in FOLDABLE_NORMS:
            fold(norm.weight, [f"{prefix}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")])
        if type(post).__name__ in FOLDABLE_NORMS:
            fold(post.weight, [f"{prefix}.mlp.{p}" for p in ("gate_proj", "up_proj")])
        up = getattr(mlp, "up_proj", None)
        if type(up) is nn.Linear and type(getattr(mlp, "down_proj", None)) is nn.Linear:
            fold(up.weight, [f"{prefix}.mlp.down_proj"], rows=True)
    inner = getattr(model, "model", None)
    final_norm = getattr(inner, "norm", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(final_norm).__name__ in FOLDABLE_NORMS and type(head) is nn.Linear:
        head_name = next((n for n, m in linears.items() if m is head), None)
        if head_name is not None:
            fold(final_norm.weight, [head_name])
    rest = {n: s for n, s in smoothing_scales(model, input_maxima, alpha).items() if n not in folded}
    for name, scale in rest.items():
        linears[name].weight.mul_(scale)
    return rest


def _torch_ao_dynamic(model: nn.Module) -> nn.Module:
    """torch.ao's stock dynamic INT8 of every nn.Linear (the default engine's kernels)."""
    untie_lm_head(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)


# ---- speed -----------------------------------------------------------------------------------


def linear_shapes(model: nn.Module) -> dict[tuple[int, int], int]:
    """(out_features, in_features) -> how many nn.Linear layers of that shape the model has."""
    shapes: dict[tuple[int, int], int] = {}
    for _name, linear in linear_layers(model):
        shape = tuple(linear.weight.shape)
        shapes[shape] = shapes.get(shape, 0) + 1
    return shapes


@contextlib.contextmanager
def threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _one_layer(kernel: Kernel, n: int, k: int, device) -> nn.Module:
    weight = torch.randn(n, k, device=device) / k**0.5
    if kernel.make_linear is None:
        return kernel.build(nn.Sequential(nn.Linear(k, n, bias=False).to(device)))[0]
    if kernel.smooth:
        return kernel.make_linear(weight, None, torch.ones(k, device=device))
    return kernel.make_linear(weight, None)


@torch.inference_mode()
def layer_ms(kernels: list[Kernel], shapes: dict[tuple[int, int], int], device="cpu", rounds: int = 8):
    """Milliseconds per token of a model's linear layers under each kernel: kernel name -> ms.

    One token (M = 1) through a random-weight layer of each shape, the fastest of `rounds`, times how
    many layers have that shape. Kernels take turns within each round, so load from other processes
    hits them alike. On CPU this runs on one thread: with more threads than free cores, OpenMP's
    barriers make small ops' times meaningless, and the ranking is what is needed.
    """
    import time

    layers = {
        kernel.name: {shape: _one_layer(kernel, *shape, device) for shape in shapes} for kernel in kernels
    }
    inputs = {k: torch.randn(1, 1, k, device=device) for (_n, k) in shapes}
    best = {(name, shape): float("inf") for name in layers for shape in shapes}
    with threads(1) if device == "cpu" else contextlib.nullcontext():
        for _ in range(rounds):
            for name, by_shape in layers.items():
                for shape, layer in by_shape.items():
                    started = time.perf_counter()
                    layer(inputs[shape[1]])
                    if device != "cpu":
                        torch.cuda.synchronize()
                    best[name, shape] = min(best[name, shape], time.perf_counter() - started)
    return {name: sum(1000 * best[name, s] * count for s, count in shapes.items()) for name in layers}


def ranked_by_speed(
    kernels: list[Kernel], model: nn.Module, cache: dict, fingerprint: str
) -> dict[str, float]:
    """Estimated ms per token of each kernel's linear layers here (measured once, then cached).

    Load-time kernels are not microbenchmarked: bitsandbytes stays the CUDA default and the CPU's last resort.
    """
    from engine.models import quant_check as qc

    shapes = linear_shapes(model)
    shape_key = hashlib.sha256(repr(sorted(shapes.items())).encode()).hexdigest()[:12]
    speeds: dict[str, float] = {}
    keys: dict[str, str] = {}
    to_measure: list[Kernel] = []
    for kernel in kernels:
        if kernel.load_time:
            speeds[kernel.name] = 0.0 if kernel.device_type == "cuda" else float("inf")
            continue
        keys[kernel.name] = key = qc.machine_key(kernel.name, kernel.version, f"speed:{shape_key}")
        cached = cache.get(key, {}).get("layer_ms")
        if cached is None:
            to_measure.append(kernel)
        else:
            speeds[kernel.name] = cached
    for device_type in {k.device_type for k in to_measure}:
        same = [k for k in to_measure if k.device_type == device_type]
        for name, ms in layer_ms(same, shapes, device_type).items():
            speeds[name] = ms
            qc.write_cache_entry(keys[name], {"kernel": name, "layer_ms": round(ms, 4)})
    return speeds
