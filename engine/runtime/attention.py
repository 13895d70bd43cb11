"""Attention over the static KV cache, where a verify forward's rows can be made to round as one-token steps do.

A one-token step attends over exactly the slots before and at its position, in one SDPA call without
a mask. A verify forward over T new tokens attends in one masked call for all T rows, and that call
rounds apart from the one-token steps: about 1e-5 on the float32 logits of the built-in model. Where
the target rounds activations to integers (block-quantized layers), such a difference moves a value
across a rounding step, and a verify row picked another token than a one-token step in 5 of 70
positions measured. `attend(..., exact_rows=True)` gives each row its own call over exactly the
slots its one-token step sees, so each row is bit for bit that step's result (the layers' matmuls
are row-exact already: engine.runtime.row_linear, engine.kernels.block_quant).

Where Tandem's C++ kernels run (float32 on an AVX2 CPU with F16C), `attend_rows` does the same in one call per
layer for every row, token trees included (engine/kernels/native/attention.cpp): a 5-token verify
forward no longer makes 150 SDPA calls, and any number of rows up to a prompt chunk is exact. It reads
float16 KV buffers (engine.runtime.kv_cache), widening each value exactly, or float32 ones.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.kernels import native_ops
from engine.kernels.cpu_features import has_avx2, has_f16c

# Verify forwards up to this many tokens may attend row by row (a call per row and layer)
EXACT_ROWS = 16


def attend(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, tokens: int, exact_rows: bool
) -> Tensor:
    """q: [1, KV, G*T, D], the G query heads that share a KV head as G*T rows (row g*T + t);
    k, v: [1, KV, W, D]; attn_mask: None (every slot visible) or additive [G*T, W]; `tokens` = T.

    exact_rows: the T tokens are the window's last T slots, in order (a verify forward, no tree):
    row t then attends over the first W - T + t + 1 slots in its own call."""
    if k.dtype != q.dtype:  # float16 buffers (engine.runtime.kv_cache), widened exactly for SDPA
        k, v = k.to(q.dtype), v.to(q.dtype)
    if not exact_rows or attn_mask is None or tokens == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    _, kv_heads, rows, head_dim = q.shape
    window = k.shape[2]
    by_token = q.view(1, kv_heads, rows // tokens, tokens, head_dim)  # [1, KV, G, T, D]
    outs = []
    for t in range(tokens):
        seen = window - tokens + t + 1
        outs.append(F.scaled_dot_product_attention(by_token[:, :, :, t], k[:, :, :seen], v[:, :, :seen]))
    return torch.stack(outs, dim=3).reshape(1, kv_heads, rows, head_dim)  # [1, KV, G, T, D] -> rows


@functools.cache
def rows_unavailable_reason() -> str | None:
    """None when the row-by-row attention kernel runs on this machine, else why it does not."""
    if os.environ.get("TANDEM_ROW_ATTENTION", "").lower() == "off":
        return "turned off by TANDEM_ROW_ATTENTION=off"
    if not has_avx2():
        return "this CPU has no AVX2"
    if not has_f16c():
        return "this CPU has no F16C"
    error = native_ops.build_error()
    if error is not None:
        return error

    @torch.library.register_fake("tandem_attention::attend")
    def _(q, k_cache, v_cache, lengths, mask):
        return q.new_empty(q.shape)

    return None


def rows_kernel_for(dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    """Whether attention over a cache of this dtype, device and head size runs on `attend_rows`."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and head_dim in (32, 64, 96, 128)
        and rows_unavailable_reason() is None
    )


ROWS_KERNEL_VERSION = 2  # bumped when attention.cpp's speed changes: stored verify-cost curves are stale


def kernel_name(model, versioned: bool = True) -> str:
    """Which attention the fast path runs for this model here, for the keys of cached measurements;
    unversioned for what the kernel's speed does not change (a compiled graph calls it the same way)."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    weight = next(model.parameters())
    if not rows_kernel_for(weight.dtype, weight.device, head_dim):
        return "sdpa"
    return f"rows-v{ROWS_KERNEL_VERSION}" if versioned else "rows"


def attend_rows(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, lengths: Tensor | None, visible: Tensor | None
) -> Tensor:
    """q: [T, H, D] float32; k_cache, v_cache: [1, KV, S, D] float16 or float32; lengths: [T], row t attends to slots
    [0, lengths[t]); or visible: [T, W] bool, row t attends to the slots it marks (a token tree).
    -> [T, H, D], each row computed alike whatever T (engine/kernels/native/attention.cpp)."""
    return torch.ops.tandem_attention.attend(q, k_cache, v_cache, lengths, visible)
