"""The interfaces the decoding loop, the drafters and the engine use to run a model with its KV cache.

`Runner` is what the speculative loop asks of a target: `ModelRunner` (eager.py, any transformers
causal LM with a DynamicCache) and `FastRunner` (fastpath.py, Llama-family models on static KV
buffers, optionally compiled) both satisfy it, each with its own values of the capabilities
(`supports_trees`, `verify_limit`, the captured hidden states). A runner whose `supports_trees` can
be True is a `TreeRunner`; one that can compile its forward is a `CompilingRunner`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Runner(Protocol):
    device: torch.device
    vocab_size: int
    context_length: int
    cache_length: int  # tokens the cache holds
    notice: str  # why this runner is not the fastest path, for the user; "" when it is
    # whether a round may verify a token tree now (forward_tree, keep_path: a TreeRunner)
    supports_trees: bool
    # whether a verify forward over n tokens gives each row the logits a one-token step would give it,
    # also where the weights' kernel rounds activations per call (row-exact kernels): what keeps
    # drafting lossless on a quantized target
    exact_verify: bool
    is_compiled: bool  # whether its forward runs compiled now
    # the most tokens one verify forward may hold (draft + 1), or None for no limit
    verify_limit: int | None
    # indices into the model's hidden states to keep from every forward, for drafters that read the
    # target's features (set by the loop; empty: none), and what the last forward kept:
    # (first position, [n, F*C]), or None
    capture_hidden: tuple[int, ...]
    last_hidden: tuple[int, torch.Tensor] | None

    def reset(self) -> None:
        """Forget the whole cache."""
        ...

    def prefill(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Appends `ids` ([n], n >= 1) to the cache; returns the logits after the last one: [V] float32."""
        ...

    def forward(self, new_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Appends `new_ids` ([n]) to the cache; returns the logits at every new position: [n, V]."""
        ...

    def rollback(self, to_length: int) -> None:
        """Forget every cached position from `to_length` on."""
        ...

    def synchronize(self) -> None:
        """Waits for queued device work; only timing needs it."""
        ...

    def compiling(self) -> CompilingRunner | None:
        """This runner as a CompilingRunner where it may compile its forward; None where it never can."""
        ...

    def static_kv_caches(self) -> list | None:
        """Its per-layer static KV buffers (each with k_cache/v_cache [1, KV, S, D]) where it keeps
        them, for engine.runtime.cache_transfer; None for a cache that grows (transformers')."""
        ...


@runtime_checkable
class TreeRunner(Runner, Protocol):
    def forward_tree(self, ids: list[int] | torch.Tensor, parents: list[int]) -> torch.Tensor:
        """A token tree in one forward: ids [n] (ids[0] the last context token, parents[0] = -1, every
        other parent an earlier index); returns logits [n, V]. The cache holds all n nodes until
        keep_path picks one root-to-node path."""
        ...

    def keep_path(self, path: list[int]) -> None:
        """After forward_tree: keep the nodes `path` (root first, each the parent of the next) as the
        cache's next len(path) positions, and forget the other nodes."""
        ...


@runtime_checkable
class CompilingRunner(Runner, Protocol):
    """A runner that may compile its forward (FastRunner): what the engine's compile manager asks of it."""

    dynamic_shapes: bool  # one graph for every length (CPU), else one per size
    tree_graph: bool  # whether the compiled forward has a token-tree graph
    compiled_capture: tuple[int, ...]  # features the compiled forward always returns
    precompiled_folder: Path | None  # where its compiled forwards are saved and read back

    def compile_refusal(self) -> str | None:
        """Why this runner cannot be compiled at all, or None."""
        ...

    def compile_now(self, progress: Callable[[str, int, int], None] | None = None) -> bool:
        """Compiles an eager runner's forward and switches to it; True when compiled."""
        ...

    def warm_up(
        self,
        sizes: Iterable[int] | None = None,
        progress: Callable[[str, int, int], None] | None = None,
        captures: Iterable[tuple[int, ...]] | None = None,
        trees: bool = False,
    ) -> None:
        """Compiles the forward in use for `sizes` (`trees`: and the token-tree graph)."""
        ...
