"""A static-cache, position-indexed forward for Llama-family models (FastLlama).

The model's own modules (embeddings, norms, projections, MLPs, head) are reused as they are, so no
weight is copied; only attention is rewritten, around one preallocated KV buffer per layer
(engine.runtime.kv_cache: float16 where the row kernel reads it, at the context chosen):

    k_cache, v_cache: [1, n_kv_heads, max_seq_length, head_dim]

A forward over T new tokens writes their keys and values at `input_pos` and attends over the
first `window` slots under a causal mask built from `input_pos`. Rolling back is free: the runner
moves its length back; stale slots are masked out and overwritten by the next forward.
Layers run fused (engine.runtime.fused_layer) where they allow it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engine.kernels.gguf_quant import GGUFLinear
from engine.runtime import row_linear
from engine.runtime.attention import attend, attend_rows, rows_kernel_for
from engine.runtime.fused_layer import FusedLayer, fusable_reason, signed_sin
from engine.runtime.kv_cache import KVCache, kv_dtype_for

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


def unsupported_reason(model) -> str | None:
    """Why `model` cannot run on the fast path, or None when it can."""
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"the fast path supports {', '.join(SUPPORTED_MODEL_TYPES)} models, not {config.model_type}"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention is not supported on the fast path"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) in ("dynamic", "longrope"):
        return "length-dependent RoPE scaling is not supported on the fast path"
    return None


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# Raised whenever FastLlama.forward's graph, or the set of graphs a runner builds, changes (5: the
# token-tree graph; 6: a layer on Tandem's kernels in one call, engine.runtime.fused_layer; 7: without
# inductor's per-call size asserts, engine.runtime.compile_cache; 8: the one-call layer takes GGUF parts;
# 9: float16 KV buffers where the row kernel reads them, engine.runtime.kv_cache): a
# compile build's marker (engine.runtime.compile_build) names the version it built, so new graphs
# are built in the background again instead of compiled from a cold cache before "Ready".
GRAPH_VERSION = 9


class FastLlama(nn.Module):
    """forward(ids [1, T], input_pos [T], mask [T, W]) -> final hidden states [1, T, C], attending over
    slots [0, W); logits(hidden) -> [.., V]. The LM head is a step of its own, so that a prompt's
    forward runs it on the last row alone: over a 32-token chunk it is 40 % of the prefill's work.

    Layers run fused (engine.runtime.fused_layer) when every layer allows it; `unfused_reason`
    says why not otherwise (quantized drafts, Qwen3's per-head norms).
    """

    def __init__(self, hf_model, max_seq_length: int, kv_dtype: torch.dtype | None = None):
        """kv_dtype: the KV buffers' dtype; None for engine.runtime.kv_cache.kv_dtype_for's choice."""
        super().__init__()
        reason = unsupported_reason(hf_model)
        if reason:
            raise ValueError(reason)
        config = hf_model.config
        inner = hf_model.model
        self.embed_tokens = inner.embed_tokens
        self.layers = inner.layers
        self.norm = inner.norm
        self.lm_head = hf_model.lm_head
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.max_seq_length = max_seq_length

        weight = self.embed_tokens.weight
        dtype, device = weight.dtype, weight.device
        # every row's attention in one call per layer, each row alike whatever their number
        # (engine.runtime.attention.attend_rows); else SDPA
        self.row_attention = rows_kernel_for(dtype, device, self.head_dim)
        gguf_blocks = any(isinstance(m, GGUFLinear) for m in hf_model.modules())
        self.kv_dtype = kv_dtype or kv_dtype_for(dtype, self.row_attention, gguf_blocks)
        self.kv_caches = nn.ModuleList(
            KVCache(self.n_kv_heads, max_seq_length, self.head_dim, self.kv_dtype, device)
            for _ in self.layers
        )
        # The model's own rotary module gives cos/sin with any static scaling (llama3, linear, yarn).
        with torch.no_grad():
            positions = torch.arange(max_seq_length, device=device).unsqueeze(0)  # [1, S]
            cos, sin = inner.rotary_emb(weight[:1].unsqueeze(0), positions)  # [1, S, D] each
        self.register_buffer("rope_cos", cos[0].to(dtype), persistent=False)  # [S, D]
        self.register_buffer("rope_sin", sin[0].to(dtype), persistent=False)
        self.unfused_reason = next(
            filter(None, (fusable_reason(layer, config) for layer in self.layers)), None
        )
        self.fused = None
        self.head_path = None  # the LM head's row-exact kernel path (with fused layers), or None
        if self.unfused_reason is None:
            self.register_buffer("rope_sin_signed", signed_sin(self.rope_sin), persistent=False)
            self.fused = nn.ModuleList(
                FusedLayer(layer, config, self.n_heads, self.n_kv_heads, self.head_dim)
                for layer in self.layers
            )
            if type(self.lm_head) is nn.Linear:
                self.head_path = row_linear.path_for(self.lm_head.weight)

    def forward(
        self,
        ids: Tensor,
        input_pos: Tensor,
        mask: Tensor | None,
        slots: Tensor | None = None,
        window: int = 0,
        capture: frozenset[int] = frozenset(),
        exact_rows: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """-> (final hidden states [1, T, C] for `logits`, features [T, F*C] of the hidden states
        `capture` names (in transformers' numbering), in layer order; or None).

        `capture` is a frozenset because compiling with dynamic shapes makes the ints of a tuple
        argument symbols, and a graph cannot choose its layers by symbols. exact_rows: each of the T
        tokens attends as a one-token step at its position would (engine.runtime.attention)."""
        # ids: [1, T], input_pos: [T] (RoPE positions), mask: [T, W] bool (True = may attend), or None
        # when every slot in [0, window) is visible; slots: [T] KV slots to write (default input_pos;
        # a token tree writes siblings at one position)
        tree = slots is not None
        slots = input_pos if slots is None else slots
        G = self.n_heads // self.n_kv_heads
        x = self.embed_tokens(ids)  # [1, T, C]
        attn_mask = lengths = visible = None
        if self.row_attention:
            if tree:  # row t sees what its mask row marks
                visible = mask
            else:  # row t sees the slots up to its position
                lengths = input_pos + 1
        elif mask is not None:
            window = mask.shape[-1]
            # additive, and repeated once here for the G query heads per KV head, not in every layer
            attn_mask = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(
                ~mask, float("-inf")
            )
            attn_mask = attn_mask.repeat(G, 1)  # [G*T, W]
        features = []
        if self.fused is not None:
            cos = self.rope_cos[input_pos].unsqueeze(1)  # [T, 1, D]
            sin = self.rope_sin_signed[input_pos].unsqueeze(1)
            for index, (layer, kv_cache) in enumerate(zip(self.fused, self.kv_caches, strict=True)):
                if index in capture:
                    features.append(x[0])
                x = layer(x, kv_cache, slots, cos, sin, attn_mask, window, exact_rows, lengths, visible)
        else:
            cos = self.rope_cos[input_pos]  # [T, D]
            sin = self.rope_sin[input_pos]
            for index, (layer, kv_cache) in enumerate(zip(self.layers, self.kv_caches, strict=True)):
                if index in capture:
                    features.append(x[0])
                h = self.attention(
                    layer.self_attn,
                    layer.input_layernorm(x),
                    kv_cache,
                    slots,
                    cos,
                    sin,
                    attn_mask,
                    window,
                    exact_rows,
                    lengths,
                    visible,
                )
                x = x + h
                x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = self.norm(x)
        captured = None
        if capture:
            if len(self.layers) in capture:
                features.append(x[0])
            captured = torch.cat(features, dim=-1)  # [T, F*C]
        return x, captured  # [1, T, C]

    def logits(self, hidden: Tensor) -> Tensor:
        """The LM head: hidden states [.., C] from forward -> logits [.., V]."""
        return row_linear.project(self.lm_head, hidden, self.head_path)

    def attention(
        self,
        attn,
        x,
        kv_cache,
        slots,
        cos,
        sin,
        attn_mask,
        window: int,
        exact_rows=False,
        lengths=None,
        visible=None,
    ) -> Tensor:
        _, T, _ = x.shape
        H, KV, D = self.n_heads, self.n_kv_heads, self.head_dim
        G, W = H // KV, window
        q = attn.q_proj(x).view(1, T, H, D)
        k = attn.k_proj(x).view(1, T, KV, D)
        v = attn.v_proj(x).view(1, T, KV, D)
        if hasattr(attn, "q_norm"):  # Qwen3 normalizes each head before RoPE
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [1, heads, T, D]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        k_all, v_all = kv_cache.update(slots, k, v)  # [1, KV, S, D]
        if lengths is not None or visible is not None:
            y = attend_rows(q[0].transpose(0, 1), k_all, v_all, lengths, visible)  # [T, H, D]
            return attn.o_proj(y.view(1, T, H * D))
        k_all, v_all = k_all[:, :, :W], v_all[:, :, :W]  # [1, KV, W, D]
        # Grouped-query attention without repeating K/V: the G query heads that share a KV head
        # (heads kv*G .. kv*G+G-1, as in transformers' repeat_kv) become G*T query rows.
        q = q.reshape(1, KV, G * T, D)
        y = attend(q, k_all, v_all, attn_mask, T, exact_rows)  # [1, KV, G*T, D]
        y = y.reshape(1, H, T, D).transpose(1, 2).reshape(1, T, H * D)
        return attn.o_proj(y)  # [1, T, C]


def causal_mask(input_pos: Tensor, window: int) -> Tensor:
    """[T, window] bool: row t may attend to slots 0..input_pos[t]."""
    slots = torch.arange(window, device=input_pos.device)
    return slots.unsqueeze(0) <= input_pos.unsqueeze(1)


def tree_inputs(parents: list[int], start: int, device) -> tuple[Tensor, Tensor, Tensor]:
    """A token tree's positions [n] (start + depth), mask [n, start + n] (the cache and each node's
    ancestors, itself included) and KV slots [n] (start.., one per node)."""
    n = len(parents)
    depth, ancestors = [0] * n, torch.eye(n, dtype=torch.bool, device=device)
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
        ancestors[i] |= ancestors[parents[i]]
    mask = torch.cat([torch.ones((n, start), dtype=torch.bool, device=device), ancestors], dim=1)
    positions = start + torch.tensor(depth, device=device)
    return positions, mask, torch.arange(start, start + n, device=device)
