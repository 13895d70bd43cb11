"""Attention over the static KV cache, where a verify forward's rows can be made to round as one-token steps do.

A one-token step attends over exactly the slots before and at its position, in one SDPA call without
a mask. A verify forward over T new tokens attends in one masked call for all T rows, and that call
rounds apart from the one-token steps: about 1e-5 on the float32 logits of the built-in model. Where
the target rounds activations to integers (block-quantized layers), such a difference moves a value
across a rounding step, and a verify row picked another token than a one-token step in 5 of 70
positions measured. `attend(..., exact_rows=True)` gives each row its own call over exactly the
slots its one-token step sees, so each row is bit for bit that step's result (the layers' matmuls
are row-exact already: engine.runtime.row_linear, engine.models.block_quant).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# Verify forwards up to this many tokens may attend row by row (a call per row and layer)
EXACT_ROWS = 16


def attend(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, tokens: int, exact_rows: bool
) -> Tensor:
    """q: [1, KV, G*T, D], the G query heads that share a KV head as G*T rows (row g*T + t);
    k, v: [1, KV, W, D]; attn_mask: None (every slot visible) or additive [G*T, W]; `tokens` = T.

    exact_rows: the T tokens are the window's last T slots, in order (a verify forward, no tree):
    row t then attends over the first W - T + t + 1 slots in its own call."""
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
