"""The interface the decoding loop and the drafters use to run a model with its KV cache.

`ModelRunner` (eager.py, any transformers causal LM with a DynamicCache) and `FastRunner`
(fastpath.py, Llama-family models on static KV buffers, optionally compiled) both satisfy it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Runner(Protocol):
    device: torch.device
    vocab_size: int
    context_length: int
    cache_length: int  # tokens the cache holds
    notice: str  # why this runner is not the fastest path, for the user; "" when it is

    def reset(self) -> None:
        """Forget the whole cache."""

    def prefill(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Appends `ids` ([n], n >= 1) to the cache; returns the logits after the last one: [V] float32."""

    def forward(self, new_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Appends `new_ids` ([n]) to the cache; returns the logits at every new position: [n, V]."""

    def rollback(self, to_length: int) -> None:
        """Forget every cached position from `to_length` on."""

    def synchronize(self) -> None:
        """Waits for queued device work; only timing needs it."""
