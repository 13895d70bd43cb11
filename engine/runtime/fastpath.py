"""A static-cache, position-indexed forward for Llama-family models, and a runner built on it.

The model's own modules (embeddings, norms, projections, MLPs, head) are reused as they are, so no
weight is copied; only attention is rewritten, around one preallocated KV buffer per layer:

    k_cache, v_cache: [1, n_kv_heads, max_seq_length, head_dim]

A forward over T new tokens writes their keys and values at `input_pos` and attends over the
first `window` slots under a causal mask built from `input_pos`. Rolling back is free: the runner
moves its length back; stale slots are masked out and overwritten by the next forward.

`FastRunner` keeps `ModelRunner`'s interface. With compiled="auto" it compiles a bounded set of
shapes (decode 1 token, verify K+1 for each K in use, prefill in fixed chunks) and runs anything
else eagerly on the same buffers; if compiling is impossible or fails, it stays eager and says why
in `notice`.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.models.memory import cache_tokens_for
from engine.runtime.eager import ModelRunner
from engine.runtime.fused_layer import FusedLayer, fusable_reason, signed_sin
from engine.runtime.protocol import Runner

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
ProgressCallback = Callable[[str, int, int], None]
# Longest prompt piece one eager forward reads (bounds the attention scores' memory).
EAGER_PREFILL_CHUNK = 512


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


class KVCache(nn.Module):
    def __init__(self, n_kv_heads: int, max_seq_length: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (1, n_kv_heads, max_seq_length, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # input_pos: [T], k, v: [1, KV, T, D]
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        return self.k_cache, self.v_cache


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FastLlama(nn.Module):
    """forward(ids [1, T], input_pos [T], mask [T, W]) -> logits [1, T, V], attending over slots [0, W).

    Layers run fused (engine.runtime.fused_layer) when every layer allows it; `unfused_reason`
    says why not otherwise (quantized drafts, Qwen3's per-head norms).
    """

    def __init__(self, hf_model, max_seq_length: int):
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
        # hidden_states indices (transformers' numbering) to keep in `captured` ([T, F*C]); eager only
        self.capture: tuple[int, ...] = ()
        self.captured: Tensor | None = None

        weight = self.embed_tokens.weight
        dtype, device = weight.dtype, weight.device
        self.kv_caches = nn.ModuleList(
            KVCache(self.n_kv_heads, max_seq_length, self.head_dim, dtype, device) for _ in self.layers
        )
        # The model's own rotary module gives cos/sin with any static scaling (llama3, linear, yarn).
        with torch.no_grad():
            positions = torch.arange(max_seq_length, device=device).unsqueeze(0)  # [1, S]
            cos, sin = inner.rotary_emb(weight[:1].unsqueeze(0), positions)  # [1, S, D] each
        self.register_buffer("rope_cos", cos[0].to(dtype), persistent=False)  # [S, D]
        self.register_buffer("rope_sin", sin[0].to(dtype), persistent=False)
        self.unfused_reason = next(filter(None, (fusable_reason(layer, config) for layer in self.layers)), None)
        self.fused = None
        if self.unfused_reason is None:
            self.register_buffer("rope_sin_signed", signed_sin(self.rope_sin), persistent=False)
            self.fused = nn.ModuleList(
                FusedLayer(layer, config, self.n_heads, self.n_kv_heads, self.head_dim) for layer in self.layers
            )

    def forward(
        self, ids: Tensor, input_pos: Tensor, mask: Tensor | None, slots: Tensor | None = None, window: int = 0
    ) -> Tensor:
        # ids: [1, T], input_pos: [T] (RoPE positions), mask: [T, W] bool (True = may attend), or None
        # when every slot in [0, window) is visible; slots: [T] KV slots to write (default input_pos;
        # a token tree writes siblings at one position)
        slots = input_pos if slots is None else slots
        G = self.n_heads // self.n_kv_heads
        x = self.embed_tokens(ids)  # [1, T, C]
        attn_mask = None
        if mask is not None:
            window = mask.shape[-1]
            # additive, and repeated once here for the G query heads per KV head, not in every layer
            attn_mask = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(~mask, float("-inf"))
            attn_mask = attn_mask.repeat(G, 1)  # [G*T, W]
        features = {}
        if self.fused is not None:
            cos = self.rope_cos[input_pos].unsqueeze(1)  # [T, 1, D]
            sin = self.rope_sin_signed[input_pos].unsqueeze(1)
            for index, (layer, kv_cache) in enumerate(zip(self.fused, self.kv_caches, strict=True)):
                if index in self.capture:
                    features[index] = x
                x = layer(x, kv_cache, slots, cos, sin, attn_mask, window)
        else:
            cos = self.rope_cos[input_pos]  # [T, D]
            sin = self.rope_sin[input_pos]
            for index, (layer, kv_cache) in enumerate(zip(self.layers, self.kv_caches, strict=True)):
                if index in self.capture:
                    features[index] = x
                h = self.attention(layer.self_attn, layer.input_layernorm(x), kv_cache, slots, cos, sin, attn_mask, window)
                x = x + h
                x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = self.norm(x)
        if self.capture:
            features[len(self.layers)] = x
            self.captured = torch.cat([features[i][0] for i in self.capture], dim=-1)  # [T, F*C]
        return self.lm_head(x)  # [1, T, V]

    def attention(self, attn, x, kv_cache, slots, cos, sin, attn_mask, window: int) -> Tensor:
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
        k_all, v_all = k_all[:, :, :W], v_all[:, :, :W]  # [1, KV, W, D]
        # Grouped-query attention without repeating K/V: the G query heads that share a KV head
        # (heads kv*G .. kv*G+G-1, as in transformers' repeat_kv) become G*T query rows.
        q = q.reshape(1, KV, G * T, D)
        y = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=attn_mask)  # [1, KV, G*T, D]
        y = y.view(1, H, T, D).transpose(1, 2).reshape(1, T, H * D)
        return attn.o_proj(y)  # [1, T, C]


def causal_mask(input_pos: Tensor, window: int) -> Tensor:
    """[T, window] bool: row t may attend to slots 0..input_pos[t]."""
    slots = torch.arange(window, device=input_pos.device)
    return slots.unsqueeze(0) <= input_pos.unsqueeze(1)


def _is_quantized(module: nn.Module) -> bool:
    name = type(module).__module__
    if getattr(module, "compilable", True) is False:  # engine.models.quant_kernels' packed INT8
        return True
    return "quantized" in name or "bitsandbytes" in name or "torchao" in name


def compiler_missing() -> str | None:
    """Why inductor cannot build CPU kernels here, or None when a C++ compiler is present."""
    compiler = os.environ.get("CXX") or "g++"
    for name in (compiler, "g++", "clang++", "c++"):
        if shutil.which(name):
            return None
    return "no C++ compiler found (install g++ or clang++ to let Tandem optimize models for this CPU)"


class FastRunner(ModelRunner):
    """ModelRunner on FastLlama: static KV buffers, free rollback, compiled forwards for a few shapes.

    compiled: "auto" compiles when it can (CPU: inductor with frozen weights and its C++ GEMMs;
    CUDA: CUDA graphs), "off" stays eager. `notice` says why it is eager when "auto" could not compile.
    """

    def __init__(
        self,
        model,
        device: torch.device | None = None,
        max_seq_length: int | None = None,
        compiled: str = "auto",
        verify_sizes: Iterable[int] = (),
        prefill_chunk: int = 32,
        compile_mode: str | None = None,
    ):
        super().__init__(model, device)
        self.max_seq_length = max_seq_length or cache_tokens_for(model.config)
        self.context_length = self.max_seq_length
        self.fast = FastLlama(model, self.max_seq_length).eval()
        self.prefill_chunk = prefill_chunk
        self.compiled_sizes = sorted({1, prefill_chunk, *verify_sizes})
        self.compile_mode = compile_mode
        self.compile_seconds: dict[int, float] = {}  # tokens -> seconds of its first (compiling) call
        self.notice = ""
        self._compiled = None
        if compiled not in ("auto", "off"):
            raise ValueError(f"compiled must be 'auto' or 'off', not {compiled!r}")
        if os.environ.get("TANDEM_COMPILE", "").lower() == "off":
            compiled = "off"
        if compiled == "auto":
            self._compiled = self._make_compiled()
        self.cache_length = 0
        self._captured_start, self._captured_pieces = 0, []

    # ModelRunner interface

    def reset(self) -> None:
        self.cache_length = 0  # stale slots are masked until overwritten

    @torch.inference_mode()
    def prefill(self, ids) -> Tensor:
        """Appends `ids` ([n], n >= 1) to the cache; returns the logits after the last one: [V] float32."""
        ids = self._as_ids(ids)
        last = None
        chunk = self._chunk_size
        self._begin_capture()
        for start in range(0, ids.numel(), chunk):
            last = self._forward_ids(ids[start : start + chunk])[-1]
        self._end_capture()
        return last

    @torch.inference_mode()
    def forward(self, new_ids) -> Tensor:
        """Appends `new_ids` ([n]) to the cache; returns the logits at every new position: [n, V] float32."""
        ids = self._as_ids(new_ids)
        self._begin_capture()
        rows = [
            self._forward_ids(ids[s : s + self._chunk_size]) for s in range(0, ids.numel(), self._chunk_size)
        ]
        self._end_capture()
        return rows[0] if len(rows) == 1 else torch.cat(rows)

    supports_trees = True

    @torch.inference_mode()
    def forward_tree(self, ids, parents: list[int]) -> Tensor:
        """A token tree in one forward: ids [n] (ids[0] the last context token, parents[0] = -1, every
        other parent an earlier index). Node i sits at position cache_length + depth(i) and attends to
        the cache and its own ancestors. Returns logits [n, V]; the cache then holds all n nodes
        until keep_path picks one root-to-node path."""
        ids = self._as_ids(ids)
        n, start = ids.numel(), self.cache_length
        assert parents[0] == -1 and all(0 <= parents[i] < i for i in range(1, n)), parents
        assert start + n <= self.max_seq_length, (start, n, self.max_seq_length)
        depth, ancestors = [0] * n, torch.eye(n, dtype=torch.bool, device=self.device)
        for i in range(1, n):
            depth[i] = depth[parents[i]] + 1
            ancestors[i] |= ancestors[parents[i]]
        mask = torch.cat([torch.ones((n, start), dtype=torch.bool, device=self.device), ancestors], dim=1)
        positions = start + torch.tensor(depth, device=self.device)
        slots = torch.arange(start, start + n, device=self.device)
        self._begin_capture()
        self.fast.capture = self.capture_hidden
        logits = self.fast(ids.view(1, -1), positions, mask, slots)[0].float()  # [n, V]
        self._tree = (start, self.fast.captured[:n] if self.capture_hidden else None)
        self.cache_length = start + n
        return logits

    def keep_path(self, path: list[int]) -> None:
        """After forward_tree: keep the nodes `path` (root first, each the parent of the next) as the
        cache's next len(path) positions, and forget the other nodes."""
        start, captured = self._tree
        assert path[0] == 0 and start + len(path) <= self.cache_length, (path, start, self.cache_length)
        source = torch.tensor(path, device=self.device) + start
        target = torch.arange(start, start + len(path), device=self.device)
        if not torch.equal(source, target):
            for cache in self.fast.kv_caches:
                for buffer in (cache.k_cache, cache.v_cache):
                    buffer.index_copy_(2, target, buffer.index_select(2, source))
        if captured is not None:
            self.last_hidden = (start, captured[torch.tensor(path, device=captured.device)])
        self.cache_length = start + len(path)

    def _begin_capture(self) -> None:
        self._captured_start, self._captured_pieces = self.cache_length, []

    def _end_capture(self) -> None:
        if self.capture_hidden:
            self.last_hidden = (self._captured_start, torch.cat(self._captured_pieces))

    @property
    def _chunk_size(self) -> int:
        """Compiled forwards take prompts in fixed chunks (one graph); eager ones read them whole,
        which is several times faster than many small forwards."""
        return self.prefill_chunk if self._compiled is not None else EAGER_PREFILL_CHUNK

    def rollback(self, to_length: int) -> None:
        """Forget every cached position from `to_length` on: free, the slots are masked then overwritten."""
        assert 0 <= to_length <= self.cache_length, (to_length, self.cache_length)
        self.cache_length = to_length

    # Compiling

    @property
    def is_compiled(self) -> bool:
        return self._compiled is not None

    def warm_up(self, sizes: Iterable[int] | None = None, progress: ProgressCallback | None = None) -> None:
        """Compiles every shape in `sizes` (default: all of `compiled_sizes`).

        Real work (tens of seconds per shape on a small CPU); `progress(stage, done, total)` reports it.
        The cache contents are kept: warm-up writes only slots beyond `cache_length`.
        """
        if self._compiled is None:
            return
        sizes = sorted(set(sizes or self.compiled_sizes))
        self.compiled_sizes = sorted({*self.compiled_sizes, *sizes})
        total = len(sizes)
        length = self.cache_length
        for done, n in enumerate(sizes):
            if progress:
                progress("optimizing for this machine", done, total)
            if length + n > self.max_seq_length:
                continue
            with torch.inference_mode():
                self._forward_ids(torch.zeros(n, dtype=torch.long, device=self.device))
            self.cache_length = length
            if self._compiled is None:  # compiling failed and the runner fell back to eager
                break
        if progress:
            progress("optimizing for this machine", total, total)

    def _make_compiled(self):
        if any(_is_quantized(module) for module in self.fast.modules()):
            self.notice = "Running without compilation: quantized weights are not compiled."
            return None
        if self.device.type == "cpu":
            missing = compiler_missing()
            if missing:
                self.notice = f"Running without compilation: {missing}."
                return None
        from engine.runtime.compile_cache import configure_inductor

        configure_inductor(self.device)
        mode = self.compile_mode or (
            "reduce-overhead" if self.device.type == "cuda" else "max-autotune-no-cudagraphs"
        )
        mode = None if mode == "default" else mode
        try:
            return torch.compile(self.fast, mode=mode, dynamic=False, fullgraph=True)
        except Exception as error:  # noqa: BLE001 - any failure means: run eagerly, and say so
            self.notice = f"Running without compilation: {type(error).__name__}: {error}"
            return None

    # Forwards

    def _forward_ids(self, ids: Tensor) -> Tensor:
        """ids: [n] with n <= _chunk_size -> logits [n, V] float32; advances cache_length by n."""
        n = ids.numel()
        start = self.cache_length
        assert n >= 1 and start + n <= self.max_seq_length, (start, n, self.max_seq_length)
        size = self._compiled_size(n, start)
        if size is None:
            logits = self._run(self.fast, ids, start, window=start + n)
        else:
            # One graph per size: it attends over every slot (the mask hides the unwritten ones), and
            # padding writes slots past the end, which are masked until overwritten.
            padded = F.pad(ids, (0, size - n))
            logits = self._run_compiled(padded, start, window=self.max_seq_length)
            if logits is None:
                logits = self._run(self.fast, ids, start, window=start + n)
            logits = logits[:n]
        if self.capture_hidden:
            self._captured_pieces.append(self.fast.captured[:n])
        self.cache_length = start + n
        return logits

    def _run(self, module, ids: Tensor, start: int, window: int) -> Tensor:
        self.fast.capture = self.capture_hidden
        n = ids.numel()
        input_pos = torch.arange(start, start + n, device=self.device)  # [T]
        # one new token at the end of the window sees all of it: no mask to build or apply
        mask = None if n == 1 and window == start + 1 else causal_mask(input_pos, window)  # [T, W]
        return module(ids.view(1, -1), input_pos, mask, None, window)[0].float()  # [T, V]

    def _run_compiled(self, ids: Tensor, start: int, window: int) -> Tensor | None:
        key = ids.numel()
        begun = time.perf_counter()
        try:
            if self.device.type == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            logits = self._run(self._compiled, ids, start, window)
            if self.device.type == "cuda":
                logits = logits.clone()  # the next CUDA-graph replay reuses its output buffer
        except Exception as error:  # noqa: BLE001 - fall back to eager with a visible notice
            self._compiled = None
            self.notice = f"Running without compilation: compiling failed ({type(error).__name__}: {error})"
            return None
        if key not in self.compile_seconds:
            self.compile_seconds[key] = time.perf_counter() - begun
        return logits

    def _compiled_size(self, n: int, start: int) -> int | None:
        """The compiled shape a forward of n tokens runs in, or None to run it eagerly.

        Sizes in `compiled_sizes` run as they are; longer runs than any verify size are padded to
        one prefill chunk; anything else (a K nobody warmed up) runs eagerly.
        """
        if self._compiled is None or self.capture_hidden:  # captured features come from eager forwards
            return None
        if n in self.compiled_sizes:
            size = n
        elif n > max(s for s in self.compiled_sizes if s != self.prefill_chunk):
            size = self.prefill_chunk
        else:
            return None
        return size if start + size <= self.max_seq_length else None

    def _as_ids(self, ids) -> Tensor:
        return torch.as_tensor(ids, dtype=torch.long, device=self.device).view(-1)


CPU_COMPILE_NOTICE = (
    "Compilation is off on CPU unless asked for: preparing each shape takes minutes on a small CPU. "
    "Set 'compiled' to 'on' to try it."
)


def make_runner(model, device=None, compiled: str = "auto", verify_sizes: Iterable[int] = ()) -> Runner:
    """The fastest runner this model supports.

    compiled: "auto" compiles on CUDA and stays eager on CPU, "on" compiles wherever it can,
    "off" never compiles. Models the fast path does not support get the generic runner; either way
    `runner.notice` says what was chosen when it is not the compiled fast path.
    """
    if compiled not in ("auto", "on", "off"):
        raise ValueError(f"compiled must be 'auto', 'on' or 'off', not {compiled!r}")
    reason = unsupported_reason(model)
    if reason is not None:
        runner = ModelRunner(model, device)
        runner.notice = f"Generic path: {reason}."
        return runner
    runner_device = torch.device(device) if device is not None else next(model.parameters()).device
    compile_now = compiled == "on" or (compiled == "auto" and runner_device.type == "cuda")
    runner = FastRunner(model, device, compiled="auto" if compile_now else "off", verify_sizes=verify_sizes)
    if compiled == "auto" and not compile_now:
        runner.notice = CPU_COMPILE_NOTICE
    return runner
