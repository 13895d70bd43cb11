"""The fast path's static KV buffers: one per layer, at the context chosen, in float16 where the row kernel reads them.

    k_cache, v_cache: [1, n_kv_heads, context, head_dim]

Where attention runs on Tandem's row kernel (an AVX2 CPU: engine.runtime.attention) for a GGUF file
run on its own blocks, the buffers are float16: half the memory of float32 and half the bytes each step reads, the row kernel
widening each value exactly (F16C) as it reads it. A one-token step and a verify row read the same
rounded values, so speculative decoding stays exact: greedy output is what the target alone writes with
this cache. Elsewhere (SDPA on a GPU or a CPU without the kernel) the buffers keep the model's dtype,
which SDPA reads without a copy.

They hold as many positions as the context chosen (engine.settings.cache_tokens_for), not the
model's own maximum: 131,072 positions of a Llama 3 model are 4.3 GB at float32, more than its weights.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# The dtype the row kernel keeps its KV buffers in
ROW_KERNEL_KV_DTYPE = torch.float16


def kv_dtype_for(model_dtype: torch.dtype, row_attention: bool, gguf_blocks: bool) -> torch.dtype:
    """The KV buffers' dtype: float16 where the row kernel reads them for a GGUF file run on its own
    blocks (llama.cpp keeps that file's cache in float16 too); the model's own dtype elsewhere, so
    that a float target (the fp32 conversion, an INT8/INT4 copy) stays the float model it was."""
    return ROW_KERNEL_KV_DTYPE if row_attention and gguf_blocks else model_dtype


class KVCache(nn.Module):
    def __init__(self, n_kv_heads: int, max_seq_length: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (1, n_kv_heads, max_seq_length, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Writes k, v ([1, KV, T, D], rounded to the buffers' dtype) at slots input_pos ([T])."""
        self.k_cache.index_copy_(2, input_pos, k.to(self.k_cache.dtype))
        self.v_cache.index_copy_(2, input_pos, v.to(self.v_cache.dtype))
        return self.k_cache, self.v_cache


def cache_bytes(kv_caches) -> int:
    """Bytes the KV buffers of `kv_caches` (FastLlama.kv_caches) hold."""
    return sum(b.numel() * b.element_size() for cache in kv_caches for b in (cache.k_cache, cache.v_cache))
