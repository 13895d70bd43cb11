"""FastRunner: a runner on the static-cache forward (engine.runtime.static_forward), compiled or eager.

`FastRunner` keeps `ModelRunner`'s interface. With compiled="auto" it compiles its forward: on
CPU with dynamic shapes (one graph for a single token, one for several, whatever the window, and
on request one for token trees); on CUDA it replays CUDA graphs captured from the eager forward
(engine.runtime.cuda_graphs), one per token count up to GRAPHED_TOKENS (decode, verify, trees) and
one per prompt chunk. If compiling is impossible or fails, it stays eager and says why in `notice`.
Longer than usual because it is one idea, a runner over static buffers, whose compiled, graphed and
eager forwards share every buffer and size rule.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.events import ProgressCallback
from engine.runtime.attention import EXACT_ROWS
from engine.runtime.compile_cache import compiler_missing, is_quantized_module
from engine.runtime.cuda_graphs import GraphedForward, graph_size, graph_window
from engine.runtime.eager import ModelRunner, ids_on
from engine.runtime.layer_forms import prefill_chunk_for, rounds_activations_per_row
from engine.runtime.precompiled import PrecompiledForward, saving_supported
from engine.runtime.static_forward import FastLlama, causal_mask, tree_inputs

# Longest prompt piece one eager forward reads (bounds the attention scores' memory).
EAGER_PREFILL_CHUNK = 512
# The compiled token-tree graph (forward_tree), as _build names it; warmed up on a root with two children
TREE = "tree"
WARM_TREE = [-1, 0, 0]


class FastRunner(ModelRunner):
    """ModelRunner on FastLlama: static KV buffers, free rollback, compiled forwards for a few shapes.

    compiled: "auto" compiles when it can (CPU: inductor with dynamic shapes, cached on disk, and its
    forwards saved in `precompiled_folder` where one is given; CUDA: CUDA graphs per size, or inductor's
    with compile_mode="reduce-overhead"), "off" stays eager. `notice` says why it is eager when "auto"
    could not compile. kv_dtype: the KV buffers' (default: engine.runtime.kv_cache.kv_dtype_for).
    """

    def __init__(
        self,
        model,
        device: torch.device | None = None,
        max_seq_length: int | None = None,
        compiled: str = "auto",
        verify_sizes: Iterable[int] = (),
        prefill_chunk: int | None = None,
        compile_mode: str | None = None,
        dynamic_shapes: bool | None = None,
        precompiled_folder: Path | None = None,
        kv_dtype: torch.dtype | None = None,
    ):
        super().__init__(model, device, max_seq_length)
        self.max_seq_length = self.context_length
        self.fast = FastLlama(model, self.max_seq_length, kv_dtype).eval()
        self.prefill_chunk = prefill_chunk or prefill_chunk_for(model)
        self.compiled_sizes = sorted({1, self.prefill_chunk, *verify_sizes})
        self.compile_mode = compile_mode
        self.compile_seconds: dict[int, float] = {}  # warmed-up size -> seconds its warm-up took
        self.notice = ""
        self._compiled = None
        self.tree_graph = False  # whether the compiled forward has a token-tree graph (warm_up(trees=True))
        self._captured: Tensor | None = None
        # features the compiled forward returns even when no drafter reads them (a draft head's
        # layers): one graph serves rounds with and without the head, for the price of a concat
        self.compiled_capture: tuple[int, ...] = ()
        self.precompiled_folder = precompiled_folder  # saved compiled forwards (engine.runtime.precompiled)
        # CPU: one graph for every length, weights as inputs (inductor's cache then holds it across
        # starts); CUDA: one graph per size, as CUDA graphs need
        self.dynamic_shapes = self.device.type != "cuda" if dynamic_shapes is None else dynamic_shapes
        # Block-quantized layers round activations to integers: verify rows must then round as
        # one-token steps do, or drafting is not exact. The row attention kernel does so in any forward,
        # trees included; else each row attends in its own SDPA call (`row_by_row`) and each verify
        # size is a compiled graph of its own (`verify_limit` caps K), and trees are off.
        rounds = self.device.type == "cpu" and rounds_activations_per_row(self.fast)
        self.row_by_row = rounds and self.dynamic_shapes and not self.fast.row_attention
        self.exact_verify = self.row_by_row or (rounds and self.fast.row_attention)
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
            last = self._forward_ids(ids[start : start + chunk], last_only=True)[-1]
        self._end_capture()
        return last

    @torch.inference_mode()
    def forward(self, new_ids) -> Tensor:
        """Appends `new_ids` ([n]) to the cache; returns the logits at every new position: [n, V] float32."""
        ids = self._as_ids(new_ids)
        self._begin_capture()
        rows = [
            self._forward_ids(ids[s : s + self._chunk_size], verify=True)
            for s in range(0, ids.numel(), self._chunk_size)
        ]
        self._end_capture()
        return rows[0] if len(rows) == 1 else torch.cat(rows)

    @property
    def supports_trees(self) -> bool:
        """Whether rounds may verify token trees: not where verify rows attend row by row in SDPA
        calls (`row_by_row`), and on a compiled CPU runner only once its tree graph is built
        (warm_up(trees=True)): the uncompiled forward rounds apart from the compiled steps."""
        if self.row_by_row:
            return False
        return self._compiled is None or not self.dynamic_shapes or self.tree_graph

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
        positions, mask, slots = tree_inputs(parents, start, self.device)
        self._begin_capture()
        result = None
        if self._compiled is not None and (self.tree_graph or self.graphed):  # a compiled tree forward
            capture = self.capture_hidden or self.compiled_capture
            if self.graphed:  # a graph per tree size, over a fixed window
                mask = F.pad(mask, (0, graph_window(start + n, self.max_seq_length) - mask.shape[-1]))
            result = self._call_compiled_tree(self._compiled, ids, positions, mask, slots, capture)
            if result is None:
                self._compiled = None
        if result is None:
            result = self.fast(ids.view(1, -1), positions, mask, slots, 0, frozenset(self.capture_hidden))
        hidden, captured = result
        logits = self.fast.logits(hidden[0]).float()  # [n, V]
        self._tree = (start, captured[:n] if self.capture_hidden else None)
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
        """Compiled forwards of fixed sizes take prompts in fixed chunks (one graph); eager and
        dynamic-shape forwards read them whole, several times faster than many small forwards."""
        fixed_sizes = self._compiled is not None and not self.dynamic_shapes
        return self.prefill_chunk if fixed_sizes else EAGER_PREFILL_CHUNK

    def rollback(self, to_length: int) -> None:
        """Forget every cached position from `to_length` on: free, the slots are masked then overwritten."""
        assert 0 <= to_length <= self.cache_length, (to_length, self.cache_length)
        self.cache_length = to_length

    # Compiling

    def compiling(self) -> FastRunner:
        return self

    def static_kv_caches(self) -> list:
        return list(self.fast.kv_caches)

    @property
    def is_compiled(self) -> bool:
        return self._compiled is not None

    @property
    def graphed(self) -> bool:
        """Whether forwards replay CUDA graphs captured from the eager forward (engine.runtime.cuda_graphs)."""
        return isinstance(self._compiled, GraphedForward)

    def warm_up(
        self,
        sizes: Iterable[int] | None = None,
        progress: ProgressCallback | None = None,
        captures: Iterable[tuple[int, ...]] | None = None,
        trees: bool = False,
    ) -> None:
        """Compiles the forward in use for `sizes` (default: all of `compiled_sizes`) and each feature
        capture in `captures` (default: what forwards capture now); falls back to eager, with a
        notice, when that fails. Real work: tens of seconds per graph on a small CPU, seconds from
        inductor's cache; `progress(stage, done, total)` reports it. `trees`: the token-tree graph
        too, with dynamic shapes (one more graph to read back at every start, so the engine asks for
        it where the measured verify cost gives trees room)."""
        if self._compiled is not None and not self._build(self._compiled, sizes, progress, captures, trees):
            self._compiled = None

    def compile_refusal(self) -> str | None:
        """Why this runner cannot be compiled at all, or None."""
        if any(is_quantized_module(module) for module in self.fast.modules()):
            return "quantized weights are not compiled"
        if self.device.type == "cpu":
            return compiler_missing()
        return None

    def compile_now(self, progress: ProgressCallback | None = None) -> bool:
        """Compiles an eager runner's forward and switches to it (on the thread that runs its
        forwards). Seconds when saved forwards or inductor's cache hold the graphs
        (engine.runtime.compile_build puts them there), a minute or more when not. True when compiled."""
        if self._compiled is None:
            self._compiled, self.tree_graph = self._make_compiled(), False
            self.warm_up(progress=progress)
        return self._compiled is not None

    def _build(self, module, sizes, progress, captures, trees: bool = False) -> bool:
        """Calls `module` once per graph to compile; with dynamic shapes that is two graphs per
        capture (one token, several tokens), whatever `sizes` says, and a third for token trees when
        `trees`; plus one per verify size where verify rows must round as one-token steps do
        (`row_by_row`)."""
        sizes = sorted(set(sizes or self.compiled_sizes))
        self.compiled_sizes = sorted({*self.compiled_sizes, *sizes})
        shapes = [(n, False) for n in sizes]
        if self.dynamic_shapes:
            shapes = [(1, False), (2, False)] + ([(TREE, False)] if trees and not self.row_by_row else [])
        if self.row_by_row:
            shapes += [(n, True) for n in self.exact_sizes]
        if captures is None:
            captures = [self.capture_hidden or self.compiled_capture]
        captures = list(dict.fromkeys(tuple(c) for c in captures))
        shapes = [(n, exact, capture) for capture in captures for n, exact in shapes]
        for done, (n, exact, capture) in enumerate(shapes):
            if progress:
                progress("optimizing for this machine", done, len(shapes))
            if not self._warm_one(module, n, capture, exact):
                return False
        if progress:
            progress("optimizing for this machine", len(shapes), len(shapes))
        return True

    def _warm_one(self, module, n: int, capture: tuple[int, ...], exact_rows: bool = False) -> bool:
        """One compiling call at the buffer's last slots, which a conversation reaches last and
        overwrites before it attends to them; skipped once a conversation has reached them."""
        tree = n == TREE
        n = len(WARM_TREE) if tree else n
        window = self.max_seq_length - (1 if self.dynamic_shapes else 0)
        if self.graphed:  # the window early replies use
            window = graph_window(n, self.max_seq_length)
        start = window - n
        if start < self.cache_length + n:
            return True
        begun = time.perf_counter()
        with torch.inference_mode():  # as real forwards run: the graph's guards check it
            ids = torch.zeros(n, dtype=torch.long, device=self.device)
            if tree:
                positions, mask, slots = tree_inputs(WARM_TREE, start, self.device)
                result = self._call_compiled_tree(module, ids, positions, mask, slots, capture)
            else:
                result = self._call_compiled(module, ids, start, window, capture, exact_rows)
            if result is None:
                return False
        self.compile_seconds.setdefault(TREE if tree else n, time.perf_counter() - begun)
        self.tree_graph = self.tree_graph or tree
        return True

    def _make_compiled(self):
        refusal = self.compile_refusal()
        if refusal:
            self.notice = f"Running without compilation: {refusal}."
            return None
        mode = self.compile_mode or ("cuda-graphs" if self.device.type == "cuda" else None)
        if mode == "cuda-graphs":
            return GraphedForward(self.fast)
        from engine.runtime.compile_cache import configure_inductor

        configure_inductor(self.device, freeze=not self.dynamic_shapes)
        mode = None if mode == "default" else mode
        try:
            # The forward's modules never change once built (weights, caches and buffers are updated in
            # place), so dynamo's per-call check of every parameter's guards is only overhead: about 0.7 ms
            # a step on 30 layers. (torch.compile takes a mode or options, not both: CUDA keeps its guards.)
            if mode is not None:
                return torch.compile(self.fast, mode=mode, dynamic=self.dynamic_shapes, fullgraph=True)
            options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
            compiled = torch.compile(self.fast, dynamic=self.dynamic_shapes, fullgraph=True, options=options)
            if not (self.dynamic_shapes and saving_supported()):
                return compiled
            return PrecompiledForward(compiled, self.fast, lambda: self.precompiled_folder)
        except Exception as error:  # noqa: BLE001 - any failure means: run eagerly, and say so
            self.notice = f"Running without compilation: {type(error).__name__}: {error}"
            return None

    # Forwards

    def _forward_ids(self, ids: Tensor, last_only: bool = False, verify: bool = False) -> Tensor:
        """ids: [n] with n <= _chunk_size -> logits [n, V] float32 (last_only: [1, V], the last
        position's); advances cache_length by n. verify: a verify forward (not a prompt), whose rows
        must round as one-token steps do where `row_by_row`."""
        n = ids.numel()
        start = self.cache_length
        assert n >= 1 and start + n <= self.max_seq_length, (start, n, self.max_seq_length)
        exact = verify and self.row_by_row and 1 < n <= EXACT_ROWS
        size = self._exact_size(n, start) if exact else self._compiled_size(n, start)
        hidden = None
        if exact:
            if size is not None:  # padding rows come after the real rows, which attend row by row
                hidden = self._run_compiled(F.pad(ids, (0, size - n)), start, start + size, exact_rows=True)
        elif size == n and self.dynamic_shapes:
            hidden = self._run_compiled(ids, start, window=start + n)
        elif size is not None:
            # One graph per size: it attends over every slot (the mask hides the unwritten ones), and
            # padding writes slots past the end, which are masked until overwritten. CUDA graphs
            # attend over a window that grows in steps as the conversation does.
            window = graph_window(start + size, self.max_seq_length) if self.graphed else self.max_seq_length
            hidden = self._run_compiled(F.pad(ids, (0, size - n)), start, window=window)
        if hidden is None:
            hidden, self._captured = self._call(self.fast, ids, start, start + n, self.capture_hidden, exact)
        logits = self.fast.logits(hidden[n - 1 : n] if last_only else hidden[:n]).float()
        if self.capture_hidden:
            self._captured_pieces.append(self._captured[:n])
        self.cache_length = start + n
        return logits

    def _call(
        self, module, ids: Tensor, start: int, window: int, capture, exact_rows: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """One forward of `module` over ids [n] at slots start.. -> (final hidden states [n, C],
        features); touches no runner state but the KV slots it writes. exact_rows: the ids are the
        window's last n slots, and each attends as a one-token step would (engine.runtime.attention)."""
        n = ids.numel()
        input_pos = torch.arange(start, start + n, device=self.device)  # [T]
        # no mask to build when one new token sees the whole window or the row kernel reads input_pos
        whole = (n == 1 and window == start + 1) or self.fast.row_attention
        mask = None if whole else causal_mask(input_pos, window)  # [T, W]
        capture = tuple(capture)
        if list(capture) != sorted(set(capture)):
            raise ValueError(f"hidden states are captured in layer order, not {capture}")
        hidden, captured = module(
            ids.view(1, -1), input_pos, mask, None, window, frozenset(capture), exact_rows=exact_rows
        )
        return hidden[0], captured  # [T, C]

    def _run_compiled(self, ids: Tensor, start: int, window: int, exact_rows: bool = False) -> Tensor | None:
        """The compiled forward's final hidden states (features in `_captured`); None after it
        failed, and the runner is eager from then on."""
        result = self._call_compiled(
            self._compiled, ids, start, window, self.capture_hidden or self.compiled_capture, exact_rows
        )
        if result is None:
            self._compiled = None
            return None
        hidden, self._captured = result
        return hidden

    def _call_compiled(self, module, ids: Tensor, start: int, window: int, capture, exact_rows: bool = False):
        """`_call` on a compiled forward -> (hidden states, features), or None when compiling or
        running it failed, which `notice` then says."""
        try:
            if self.device.type == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            hidden, captured = self._call(module, ids, start, window, capture, exact_rows)
        except Exception as error:  # noqa: BLE001 - any failure means: stay eager, and say so
            self.notice = f"Running without compilation: compiling failed ({type(error).__name__}: {error})"
            return None
        return self._kept(hidden, captured)

    def _call_compiled_tree(self, module, ids, positions, mask, slots, capture):
        """A token tree's forward on the compiled graph -> (hidden states, features), or None when
        compiling or running it failed, which `notice` then says."""
        try:
            hidden, captured = module(ids.view(1, -1), positions, mask, slots, 0, frozenset(capture))
        except Exception as error:  # noqa: BLE001 - any failure means: stay eager, and say so
            self.notice = f"Running without compilation: compiling failed ({type(error).__name__}: {error})"
            return None
        return self._kept(hidden, captured)

    def _kept(self, hidden: Tensor, captured: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """A compiled forward's outputs, copied on CUDA: the next CUDA-graph replay reuses its buffers."""
        if self.device.type == "cuda":
            return hidden.clone(), None if captured is None else captured.clone()
        return hidden, captured

    def _compiled_size(self, n: int, start: int) -> int | None:
        """The compiled shape a forward of n tokens runs in, or None to run it eagerly.

        Dynamic shapes: every n. CUDA graphs: n up to GRAPHED_TOKENS, longer runs padded to one
        prefill chunk. Other fixed sizes: sizes in `compiled_sizes` run as they are; longer runs than
        any verify size are padded to one prefill chunk; any other (a K nobody warmed up) runs eagerly."""
        if self._compiled is None:
            return None
        if self.dynamic_shapes:
            return n
        if self.graphed:
            size = graph_size(n, self.prefill_chunk)
        elif n in self.compiled_sizes:
            size = n
        elif n > max(s for s in self.compiled_sizes if s != self.prefill_chunk):
            size = self.prefill_chunk
        else:
            return None
        return size if start + size <= self.max_seq_length else None

    @property
    def exact_sizes(self) -> list[int]:
        """Verify sizes a compiled `row_by_row` runner runs row by row, each a graph of its own."""
        return [n for n in self.compiled_sizes if 1 < n <= EXACT_ROWS and n != self.prefill_chunk]

    @property
    def verify_limit(self) -> int | None:
        """The most tokens a verify forward may hold (draft + 1), or None for no limit: a compiled
        `row_by_row` runner's largest verify graph (a longer one would run eagerly, which rounds
        apart from the compiled one-token step)."""
        if not (self.row_by_row and self._compiled is not None):
            return None
        return max(self.exact_sizes, default=1)

    def _exact_size(self, n: int, start: int) -> int | None:
        """The compiled verify graph a `row_by_row` forward of n tokens runs in, or None (eagerly)."""
        if self._compiled is None:
            return None
        size = min((s for s in self.exact_sizes if s >= n), default=None)
        return size if size is not None and start + size <= self.max_seq_length else None

    def _as_ids(self, ids) -> Tensor:
        """[n] long ids; an inference tensor like every other input, or a compiled graph's guards
        (which check autograd's dispatch keys) would fail and compile it again."""
        ids = ids_on(self.device, ids).view(-1)
        return ids if ids.is_inference() or not torch.is_inference_mode_enabled() else ids.clone()
