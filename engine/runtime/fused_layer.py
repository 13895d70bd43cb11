"""A decoder layer's projections fused into fewer, larger matmuls, for the fast path's forward.

At one token per step a small model's forward is a few hundred tiny ops, and on a CPU each op's
dispatch costs microseconds while its matmul only streams weights from memory. Fusing q, k and v
into one matmul and gate and up into another (as llama.cpp, vLLM and gpt-fast do) cuts seven
matmuls per layer to four, and one RoPE over the queries and keys together replaces two.

The fused weight is the only copy: the model's own q/k/v (and gate/up) Linear modules are pointed
at row slices of it, so the model keeps working as it was and no memory is added.

Where Tandem's kernels run (the float row kernel or the 4/8-bit block kernels, with row attention), a
layer is one call to engine/kernels/native/decoder_layer.cpp: norms, RoPE, the cache writes, attention,
SiLU and the residual adds around the four matmuls, about ten calls of the compiled graph fewer per layer.
"""

from __future__ import annotations

import functools
import os
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.kernels import native_ops
from engine.kernels.block_quant import BlockQuantLinear, concatenated, shares_buffers
from engine.kernels.gguf_quant import GGUFLinear, GGUFParts
from engine.runtime import row_linear
from engine.runtime.attention import attend, attend_rows

# Norm classes whose forward is weight * x * rsqrt(mean(x^2) + eps), which F.rms_norm computes in one op.
PLAIN_RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
# layer -> its fused tensors; kept outside the module so that a deep copy (a quantized draft made
# from the model) does not carry float copies along
_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plain_linear(module) -> bool:
    return (
        type(module) is nn.Linear
        and not hasattr(module, "_hf_hook")  # accelerate's offloading moves weights at call time
        and module.weight.device.type != "meta"
    )


def all_gguf(modules) -> bool:
    """All of `modules` GGUF layers on one code path, so that they run as one layer's projections."""
    modules = list(modules)
    return all(type(m) is GGUFLinear for m in modules) and len({m.path for m in modules}) == 1


def _same_block_quant(modules) -> bool:
    """All of `modules` block-quantized alike (engine.kernels.block_quant), so they fuse as one layer."""
    return all(type(m) is BlockQuantLinear for m in modules) and len({(m.bits, m.path) for m in modules}) == 1


@functools.cache
def layer_kernel_unavailable_reason() -> str | None:
    """None when a layer on Tandem's kernels runs as one call of decoder_layer.cpp, else why it runs op by op."""
    if os.environ.get("TANDEM_LAYER_KERNEL", "").lower() == "off":
        return "turned off by TANDEM_LAYER_KERNEL=off"
    error = native_ops.build_error()
    if error is not None:
        return error
    _register_fake()
    return None


@functools.cache
def _register_fake() -> None:
    @torch.library.register_fake("tandem_layer::decoder_layer")
    def _(x, *args):
        return x.new_empty(x.shape)


LAYER_KERNEL_VERSION = 2  # bumped when decoder_layer.cpp's speed changes: stored verify-cost curves are stale


def kernel_name(model, versioned: bool = True) -> str:
    """Whether the fast path runs this model's layers (float or block-quantized) as one call each
    here, for the keys of cached measurements and compiled builds (a graph of one call per layer is
    another graph)."""
    from engine.runtime import attention

    one_call = (
        row_linear.kernel_name(model) != "F.linear"
        and attention.kernel_name(model) != "sdpa"
        and layer_kernel_unavailable_reason() is None
    )
    if not one_call:
        return "op-by-op"
    return f"one-call-v{LAYER_KERNEL_VERSION}" if versioned else "one-call"


def fusable_reason(layer, config) -> str | None:
    """Why `layer` must run unfused (as its own modules), or None when it can be fused."""
    attn, mlp = layer.self_attn, layer.mlp
    projections = (
        attn.q_proj,
        attn.k_proj,
        attn.v_proj,
        attn.o_proj,
        mlp.gate_proj,
        mlp.up_proj,
        mlp.down_proj,
    )
    if not (_same_block_quant(projections) or all_gguf(projections)):
        if not all(_plain_linear(p) for p in projections):
            return "quantized or offloaded projections"
        if len({p.weight.dtype for p in projections}) != 1:
            return "mixed weight types"
    if len({attn.q_proj.bias is None, attn.k_proj.bias is None, attn.v_proj.bias is None}) != 1:
        return "some of q, k, v have a bias"
    if mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
        return "gate/up biases"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act}"
    if hasattr(attn, "q_norm"):
        return "per-head query/key norms"
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if not all(type(n).__name__ in PLAIN_RMS_NORMS for n in norms):
        return "a norm other than RMSNorm"
    return None


def _fuse(linears: list[nn.Linear], with_bias: bool) -> tuple[Tensor, Tensor | None]:
    """One [sum(out), in] weight (and bias) whose row slices become the modules' own parameters."""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    bias = torch.cat([linear.bias.detach() for linear in linears]) if with_bias else None
    start = 0
    for linear in linears:
        end = start + linear.out_features
        linear.weight = nn.Parameter(weight[start:end], requires_grad=False)
        if bias is not None:
            linear.bias = nn.Parameter(bias[start:end], requires_grad=False)
        start = end
    return weight, bias


def _already_fused(linears: list[nn.Linear], weight: Tensor) -> bool:
    """True when the modules still point into `weight` (a second runner over the same model)."""
    start = 0
    for linear in linears:
        if linear.weight.data_ptr() != weight[start].data_ptr():
            return False
        start += linear.out_features
    return start == weight.shape[0]


# On a GPU, half-precision norms run as torch's one RMSNorm kernel rather than the model's seven
# (upcast, square, mean, rsqrt, two products, downcast): at one token a step is bound by kernel
# count, not bytes. It rounds once where the model's module rounds twice; eager and graphed
# forwards run the same kernel, so each is exactly the other.
ONE_KERNEL_NORM_ON_CUDA = True


class FusedLayer(nn.Module):
    """forward(x, kv_cache, slots, cos, sin_signed, attn_mask, window, exact_rows) for one Llama/Qwen2 layer.

    x: [1, T, C]; cos and sin_signed: [T, D] with rotate_half's sign folded into sin, so that RoPE is
    x * cos + roll(x, D/2) * sin_signed; attn_mask: None (every slot < window visible) or an
    additive float mask [G*T, window] already repeated for the G query heads that share a KV head;
    exact_rows: see engine.runtime.attention.attend. lengths [T] or visible [T, W] instead: attention
    on the row kernel (engine.runtime.attention.attend_rows), which reads the whole cache.
    """

    def __init__(self, layer, config, n_heads: int, n_kv_heads: int, head_dim: int):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
        gate_up = [mlp.gate_proj, mlp.up_proj]
        self.qkv_quant = self.gate_up_quant = None  # fused block-quantized projections, if quantized
        self.block_types: list[int] = []  # GGUF parts' block types, in decoder_layer.cpp's order
        cached = _FUSED.get(layer)
        on_gguf = all_gguf(qkv + gate_up + [attn.o_proj, mlp.down_proj])
        on_blocks = not on_gguf and _same_block_quant(qkv + gate_up)
        if on_gguf:
            self.qkv_quant, self.gate_up_quant = GGUFParts(qkv), GGUFParts(gate_up)
            parts = qkv + [attn.o_proj] + gate_up + [mlp.down_proj]
            self.block_types = [part.block_type for part in parts]
            qkv_weight = qkv_bias = gate_up_weight = None
        elif on_blocks:
            if cached is None or not (shares_buffers(qkv, cached[0]) and shares_buffers(gate_up, cached[1])):
                cached = _FUSED[layer] = (concatenated(qkv), concatenated(gate_up))
            self.qkv_quant, self.gate_up_quant = cached
            qkv_weight = qkv_bias = gate_up_weight = None
        else:
            if cached is None or not (_already_fused(qkv, cached[0]) and _already_fused(gate_up, cached[2])):
                qkv_weight, qkv_bias = _fuse(qkv, with_bias=attn.q_proj.bias is not None)
                gate_up_weight, _ = _fuse(gate_up, with_bias=False)
                cached = _FUSED[layer] = (qkv_weight, qkv_bias, gate_up_weight)
            qkv_weight, qkv_bias, gate_up_weight = cached
        self.register_buffer("qkv_weight", qkv_weight, persistent=False)
        self.register_buffer("qkv_bias", qkv_bias, persistent=False)
        self.register_buffer("gate_up_weight", gate_up_weight, persistent=False)
        self.o_proj, self.down_proj = attn.o_proj, mlp.down_proj
        # the row-exact float kernel's code path (engine.runtime.row_linear), or None for F.linear
        self.linear_path = None if qkv_weight is None else row_linear.path_for(qkv_weight)
        # the whole layer in one call (with row attention: `lengths` or `visible` given)
        on_kernels = self.linear_path is not None or self.qkv_quant is not None
        self.one_call = on_kernels and layer_kernel_unavailable_reason() is None
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.eps = float(layer.input_layernorm.variance_epsilon)
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.hidden_size = config.hidden_size

    def forward(
        self,
        x,
        kv_cache,
        slots,
        cos,
        sin_signed,
        attn_mask,
        window: int,
        exact_rows=False,
        lengths=None,
        visible=None,
    ) -> Tensor:
        _, T, C = x.shape
        H, KV, D = self.n_heads, self.n_kv_heads, self.head_dim
        if self.one_call and (lengths is not None or visible is not None):
            qkv, o, gate_up, down, bits, path = self._projections()
            return torch.ops.tandem_layer.decoder_layer(
                x[0],
                self.input_norm.weight,
                self.post_norm.weight,
                self.eps,
                qkv,
                self._qkv_bias(),
                o,
                self.o_proj.bias,
                gate_up,
                down,
                self.down_proj.bias,
                bits,
                self.block_types,
                cos[:, 0],
                sin_signed[:, 0],
                kv_cache.k_cache,
                kv_cache.v_cache,
                slots,
                lengths,
                visible,
                H,
                path,
            ).unsqueeze(0)
        G = H // KV
        h = self._norm(x, self.input_norm)
        if self.qkv_quant is not None:
            qkv = self.qkv_quant(h)
        else:
            qkv = row_linear.linear(h, self.qkv_weight, self.qkv_bias, self.linear_path)
        qkv = qkv.view(1, T, H + 2 * KV, D)
        qk = qkv[:, :, : H + KV]
        qk = qk * cos + torch.roll(qk, D // 2, dims=-1) * sin_signed  # [1, T, H+KV, D]
        k = qk[:, :, H:].transpose(1, 2)  # [1, KV, T, D]
        v = qkv[:, :, H + KV :].transpose(1, 2)
        k_all, v_all = kv_cache.update(slots, k, v)
        if lengths is not None or visible is not None:
            y = attend_rows(qk[0, :, :H], k_all, v_all, lengths, visible).view(1, T, H * D)
        else:
            k_all, v_all = k_all[:, :, :window], v_all[:, :, :window]
            # The G query heads that share a KV head become G*T query rows (no repeated K/V).
            q = qk[:, :, :H].transpose(1, 2).reshape(1, KV, G * T, D)
            y = attend(q, k_all, v_all, attn_mask, T, exact_rows)  # [1, KV, G*T, D]
            y = y.reshape(1, H, T, D).transpose(1, 2).reshape(1, T, H * D)
        x = x + row_linear.project(self.o_proj, y, self.linear_path)
        h = self._norm(x, self.post_norm)
        if self.gate_up_quant is not None:
            gate_up = self.gate_up_quant(h)
        else:
            gate_up = row_linear.linear(h, self.gate_up_weight, None, self.linear_path)
        gate, up = gate_up.chunk(2, dim=-1)
        return x + row_linear.project(self.down_proj, F.silu(gate) * up, self.linear_path)

    def _projections(self) -> tuple[list, list, list, list, int, str]:
        """The four projections' tensors as decoder_layer.cpp takes them, with their bits (0: float;
        -1: GGUF parts of `block_types`) and their kernel's code path."""
        if self.block_types:
            layers = self.qkv_quant, self.o_proj, self.gate_up_quant, self.down_proj
            blocks = (layer.blocks if isinstance(layer, GGUFParts) else [layer.blocks] for layer in layers)
            return *blocks, -1, self.qkv_quant.path
        if self.qkv_quant is None:
            weights = self.qkv_weight, self.o_proj.weight, self.gate_up_weight, self.down_proj.weight
            return *([w] for w in weights), 0, self.linear_path
        layers = self.qkv_quant, self.o_proj, self.gate_up_quant, self.down_proj
        blocks = ([layer.qweight, layer.scales, layer.mins] for layer in layers)
        return *blocks, self.qkv_quant.bits, self.qkv_quant.path

    def _qkv_bias(self) -> Tensor | None:
        return self.qkv_bias if self.qkv_quant is None else self.qkv_quant.bias

    def _norm(self, x: Tensor, norm) -> Tensor:
        if x.dtype == torch.float32 or (x.is_cuda and ONE_KERNEL_NORM_ON_CUDA):
            return F.rms_norm(x, (self.hidden_size,), norm.weight, self.eps)
        return norm(x)  # the model's own rounding for half-precision inputs on a CPU


def signed_sin(sin: Tensor) -> Tensor:
    """sin with rotate_half's sign folded in: rotate_half(x) * sin == roll(x, D/2) * signed_sin(sin)."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
