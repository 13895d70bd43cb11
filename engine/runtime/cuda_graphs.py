"""CUDA graphs of the static-cache forward, captured from the eager forward, one per shape, on first use.

A decode step of a 7B model is hundreds of kernel launches; launched one at a time from Python, the GPU
waits on the CPU between them. A CUDA graph replays them all in one launch. FastLlama's forward reads
only tensors (ids, positions, mask, KV slots) and buffers that stay at fixed addresses (weights, KV
caches, RoPE tables), so each shape is captured once from the eager forward, as vLLM captures its
decode graphs: a forward's time, where inductor's reduce-overhead mode compiles each shape for a
minute or more.

The graphs share one memory pool. A replay's outputs live in that pool until the next replay, so the
caller copies what it keeps (FastRunner does).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# Token counts (decode, verify, token trees) captured as graphs of their own; longer forwards are
# prompts, padded to the runner's prefill chunk
GRAPHED_TOKENS = 16
# Graphs attend over the first `graph_window` KV slots: the smallest power of two (at least this
# many) that holds the forward, so a short conversation does not read a long buffer at every step
SMALLEST_WINDOW = 256


def graph_size(n: int, prefill_chunk: int) -> int:
    """The graph a forward over n tokens replays: its own up to GRAPHED_TOKENS, else a prompt chunk's."""
    return n if n <= GRAPHED_TOKENS else prefill_chunk


def graph_window(end: int, max_seq_length: int) -> int:
    """KV slots a graph attends over when a forward writes slots up to `end` (exclusive)."""
    window = SMALLEST_WINDOW
    while window < end:
        window *= 2
    return min(window, max_seq_length)


@dataclass
class CapturedForward:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[Tensor | None, ...]  # (ids, positions, mask, slots), at the addresses the graph reads
    outputs: tuple[Tensor, Tensor | None]  # (hidden states, features), where each replay writes them

    def replay(self, inputs: tuple[Tensor | None, ...]) -> tuple[Tensor, Tensor | None]:
        for static, new in zip(self.inputs, inputs, strict=True):
            if static is not None:
                static.copy_(new)
        self.graph.replay()
        return self.outputs


class GraphedForward:
    """Calls like FastLlama.forward; replays a CUDA graph per (tokens, mask width, tree, window,
    features) shape, capturing it on first use."""

    def __init__(self, fast: torch.nn.Module):
        self.fast = fast
        self.graphs: dict[tuple, CapturedForward] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(
        self,
        ids: Tensor,
        input_pos: Tensor,
        mask: Tensor | None,
        slots: Tensor | None = None,
        window: int = 0,
        capture: frozenset[int] = frozenset(),
        exact_rows: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        if exact_rows:  # row-by-row attention is a CPU matter: run it as it is
            return self.fast(ids, input_pos, mask, slots, window, capture, exact_rows)
        key = (ids.shape[1], None if mask is None else mask.shape[-1], slots is not None, window, capture)
        inputs = (ids, input_pos, mask, slots)
        captured = self.graphs.get(key)
        if captured is None:
            captured = self.graphs[key] = self._capture(inputs, window, capture)
        return captured.replay(inputs)

    def _capture(self, inputs, window: int, capture: frozenset[int]) -> CapturedForward:
        static = tuple(None if tensor is None else tensor.clone() for tensor in inputs)

        def run():
            return self.fast(*static, window=window, capture=capture)

        # One run outside the graph first, on a side stream as capture requires: it sets up cuBLAS's
        # workspace and loads lazy kernels. It writes the same KV slots the replay writes next, with
        # the same values, so the cache is as the caller left it.
        stream = torch.cuda.Stream(device=static[0].device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = run()
        return CapturedForward(graph, static, outputs)
