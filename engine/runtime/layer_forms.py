"""What the fast path reads from the forms of a model's layers: how many prompt tokens a forward
takes, and whether verify rows must round as one-token steps do. Type checks alone: the kernels
(engine.kernels) are not called."""

from __future__ import annotations

from torch import nn

from engine.kernels.block_quant import INTEGER_ROWS, BlockQuantLinear
from engine.kernels.gguf_quant import GGUFLinear


def rounds_activations_per_row(module: nn.Module) -> bool:
    """Whether `module`'s layers round activations per row, alike whatever the number of rows (block
    layers, and layers on a GGUF file's own blocks): a forward's verify rows are then bit for bit its
    one-token steps only if attention is too."""
    return any(type(child) in (BlockQuantLinear, GGUFLinear) for child in module.modules())


def prefill_chunk_for(model: nn.Module) -> int:
    """Prompt tokens per forward: 32, or more where block-quantized layers switch to a float GEMM
    above the sizes decoding and verification use (INTEGER_ROWS)."""
    if any(type(m) is BlockQuantLinear for m in model.modules()):
        return 2 * INTEGER_ROWS
    return 32
