"""Linear layers and embeddings that compute on a GGUF file's own quantized blocks.

The blocks stay as the file stores them (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; memory-mapped
by engine.models.gguf_native, never repacked or dequantized whole), and the C++ kernel
(engine/kernels/native/gguf_quant.cpp, the torch ops `tandem_gguf::linear` and
`tandem_gguf::dequantize_rows`) quantizes each call's activations to INT8 blocks of 32 (of 256 for the
K-quants, whose sub-block scales then multiply integer dot products in integer arithmetic) and takes
integer dot products. Each output row is computed alike whatever the number of rows in the call, so a
verify forward's rows are bit for bit the one-token steps' (see the .cpp for the arithmetic).

Code paths: AVX-512 VNNI, AVX2, portable C++; `best_path` picks the one this CPU runs.
"""

from __future__ import annotations

import functools

import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import Tensor, nn

from engine.kernels import native_ops
from engine.kernels.cpu_features import cpu_flags, has_avx2

BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
TYPE_IDS = {name: int(GGMLQuantizationType[name]) for name in BLOCK_TYPES}
TYPE_NAMES = {number: name for name, number in TYPE_IDS.items()}
PATHS = ("vnni", "avx2", "portable")


def block_layout(block_type: int) -> tuple[int, int]:
    """(values, bytes) of one block of a supported type."""
    if block_type not in TYPE_NAMES:
        raise ValueError(f"no kernel for GGUF block type {block_type}")
    values, size = GGML_QUANT_SIZES[GGMLQuantizationType(block_type)]
    return values, size


def row_bytes(block_type: int, in_features: int) -> int:
    values, size = block_layout(block_type)
    return in_features // values * size


@functools.cache
def build_error() -> str | None:
    """None once the ops are loaded (building Tandem's kernels the first time), else why they cannot be."""
    error = native_ops.build_error()
    if error is None:

        @torch.library.register_fake("tandem_gguf::linear")
        def _(x, weights, types, path):
            return x.new_empty(x.shape[0], sum(w.shape[0] for w in weights))

        @torch.library.register_fake("tandem_gguf::dequantize_rows")
        def _(weight, block_type, k, rows):
            return weight.new_empty(rows.numel(), k, dtype=torch.float32)

    return error


def _require_ops() -> None:
    error = build_error()
    if error is not None:
        raise RuntimeError(error)


def best_path() -> str:
    flags = cpu_flags()
    if {"avx512_vnni", "avx512vl", "avx512bw", "avx512dq", "f16c"} <= flags:
        return "vnni"
    if has_avx2() and "f16c" in flags:
        return "avx2"
    return "portable"


def linear(x: Tensor, parts: list[Tensor], types: list[int], path: str) -> Tensor:
    """x [M, K] float32 against weight parts [N_p, row bytes] -> [M, sum N_p], side by side."""
    return torch.ops.tandem_gguf.linear(x, parts, types, path)


class GGUFLinear(nn.Module):
    """An nn.Linear replacement over a GGUF tensor's blocks: float activations in and out.

    `blocks`: [out_features, row bytes] uint8, the tensor's bytes as the file holds them.
    """

    def __init__(
        self,
        blocks: Tensor,
        block_type: int,
        in_features: int,
        bias: Tensor | None = None,
        path: str | None = None,
    ):
        super().__init__()
        _require_ops()
        if blocks.dtype != torch.uint8 or blocks.dim() != 2:
            raise ValueError("GGUF blocks must be a [rows, bytes] uint8 tensor")
        if in_features % block_layout(block_type)[0] or blocks.shape[1] != row_bytes(block_type, in_features):
            raise ValueError(
                f"{blocks.shape[1]} bytes a row do not hold {in_features} values of {TYPE_NAMES[block_type]}"
            )
        self.out_features, self.in_features = blocks.shape[0], in_features
        self.block_type, self.path = block_type, path or best_path()
        self.register_buffer("blocks", blocks, persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        y = linear(x.reshape(-1, shape[-1]).float(), [self.blocks], [self.block_type], self.path)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features).to(x.dtype)

    def rows(self, ids: Tensor) -> Tensor:
        """The float weight rows [n, in_features] the blocks hold for output ids `ids` [n]."""
        return torch.ops.tandem_gguf.dequantize_rows(self.blocks, self.block_type, self.in_features, ids)

    def dequantized_weight(self) -> Tensor:
        return self.rows(torch.arange(self.out_features))

    def extra_repr(self) -> str:
        name = TYPE_NAMES[self.block_type]
        return f"in={self.in_features}, out={self.out_features}, type={name}, path={self.path}"


class GGUFEmbedding(nn.Module):
    """An nn.Embedding replacement over a GGUF tensor's blocks: each looked-up row is dequantized.

    `scale` multiplies the rows (Gemma scales its embeddings by sqrt(hidden size)).
    """

    def __init__(self, blocks: Tensor, block_type: int, embedding_dim: int, scale: float | None = None):
        super().__init__()
        _require_ops()
        self.num_embeddings, self.embedding_dim = blocks.shape[0], embedding_dim
        self.block_type, self.scale = block_type, scale
        if blocks.shape[1] != row_bytes(block_type, embedding_dim):
            raise ValueError(f"embedding rows do not hold {embedding_dim} values of {TYPE_NAMES[block_type]}")
        self.register_buffer("blocks", blocks, persistent=False)

    @property
    def weight(self) -> Tensor:
        """A one-row stand-in for code that reads an embedding's dtype and device (the static forward)."""
        return torch.ops.tandem_gguf.dequantize_rows(
            self.blocks, self.block_type, self.embedding_dim, torch.zeros(1, dtype=torch.long)
        )

    def rows(self, ids: Tensor) -> Tensor:
        """The float rows [n, dim] the blocks hold for `ids` [n], unscaled."""
        return torch.ops.tandem_gguf.dequantize_rows(self.blocks, self.block_type, self.embedding_dim, ids)

    def forward(self, ids: Tensor) -> Tensor:
        rows = self.rows(ids.reshape(-1))
        if self.scale is not None:
            rows = rows * self.scale
        return rows.view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, type={TYPE_NAMES[self.block_type]}"


class GGUFParts(nn.Module):
    """Several GGUFLinear layers computed side by side, their activations quantized once: a fused
    projection (q, k and v; gate and up) whose parts may be of different block types. Each part keeps
    its own blocks, so nothing is copied."""

    def __init__(self, layers: list[GGUFLinear]):
        super().__init__()
        if len({layer.in_features for layer in layers}) != 1 or len({layer.path for layer in layers}) != 1:
            raise ValueError("fused GGUF parts must share their input and code path")
        self.parts = nn.ModuleList(layers)
        self.types = [layer.block_type for layer in layers]
        self.path = layers[0].path
        self.out_features = sum(layer.out_features for layer in layers)
        biases = [layer.bias for layer in layers]
        if all(bias is None for bias in biases):
            self.register_buffer("bias", None, persistent=False)
        else:
            filled = [
                torch.zeros(layer.out_features) if b is None else b
                for layer, b in zip(layers, biases, strict=True)
            ]
            self.register_buffer("bias", torch.cat(filled), persistent=False)

    @property
    def blocks(self) -> list[Tensor]:
        return [layer.blocks for layer in self.parts]

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        y = linear(x.reshape(-1, shape[-1]).float(), self.blocks, self.types, self.path)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features).to(x.dtype)
