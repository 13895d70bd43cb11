"""Rows of a layer's weights as floats, whichever form holds them: the one place that knows which
quantized layers give their weights back (a draft head reads the target's LM head and embedding)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engine.kernels.block_quant import BlockQuantLinear
from engine.kernels.gguf_quant import GGUFEmbedding, GGUFLinear


def float_rows(module: nn.Module, ids: Tensor) -> Tensor | None:
    """Rows `ids` of `module`'s weight on its own device: a float weight's, or the dequantized rows of
    Tandem's block layers and of a GGUF file's own blocks (only those rows are unpacked). None for
    kernels that keep no weights to give back (torch's dynamic INT8, bitsandbytes)."""
    if isinstance(module, (GGUFLinear, GGUFEmbedding)):
        return module.rows(ids)
    if isinstance(module, BlockQuantLinear):
        weight = module.dequantized_weight()
        return weight[ids.to(weight.device)]
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.detach()[ids.to(weight.device)]
    return None
