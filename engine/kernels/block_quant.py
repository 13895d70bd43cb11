"""Block-quantized linear layers (4- or 8-bit weights in blocks of 32) with integer dot products on the CPU.

The arithmetic is llama.cpp's: weights in blocks of 32 with a scale (and, at 4 bits, an offset) per
block; the activations are quantized on each call to INT8 blocks of 32, each with its own scale, and
the block products are integer dot products (AVX-512 VNNI, AVX2, or portable C++). A GGUF's Q4_1
block (w = d·q + m) is one of these blocks as it stands, so a 4-bit target can hold a GGUF's weights.

The kernel is C++ (engine/kernels/native/block_quant.cpp, built on first use by
engine.kernels.native_ops). It is registered as the torch op
`tandem_block_quant::linear`, so compiled forwards call it like any other op. Without a C++ compiler
(the installed bundle) the kernels are unavailable and the kernel list says why.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from engine.kernels import native_ops
from engine.kernels.cpu_features import cpu_flags, has_avx2

BLOCK = 32
PAIR = 2 * BLOCK  # the kernel works on pairs of blocks
# Up to this many rows per call take integer dot products, each row's result the same whatever the
# count (decoding, and verification up to the largest token tree); more rows (a prompt) take a float
# GEMM on the weights dequantized tile by tile. Must match kIntegerRows in block_quant.cpp.
INTEGER_ROWS = 48


@functools.cache
def build_error() -> str | None:
    """None once the op is loaded (building Tandem's kernels the first time), else why it cannot be."""
    error = native_ops.build_error()
    if error is None:
        # the output's shape for tracing (torch.compile), without running the kernel
        @torch.library.register_fake("tandem_block_quant::linear")
        def _(x, qweight, scales, mins, bits, path):
            return x.new_empty(x.shape[0], qweight.shape[0])

    return error


def best_path() -> str:
    flags = cpu_flags()
    if {"avx512_vnni", "avx512vl"} <= flags:
        return "vnni"
    if has_avx2():
        return "avx2"
    return "portable"


def holds_in_4bit_blocks(model: nn.Module, layers: int = 2) -> bool:
    """Whether the decoder layers' float weights are 4-bit blocks as they stand (a model read from a
    Q4_0, Q4_1 or Q4_K GGUF, the built-in one among them): a 4-bit copy then holds those layers'
    very weights. Checks the first and last projections; the LM head, which such files often keep at
    6 or 8 bits, is not asked."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = [
        m for m in model.modules() if type(m) is nn.Linear and m is not head and m.in_features % PAIR == 0
    ]
    if not linears:
        return False
    with torch.no_grad():
        for linear in linears[:layers] + linears[-layers:]:
            weight = linear.weight.detach()[:256].float().cpu()
            if not torch.equal(dequantize_blocks(*quantize_blocks(weight, 4), 4), weight):
                return False
    return True


def pair_order(k: int) -> torch.Tensor:
    """Column order of the kernel's layout: each pair of blocks interleaved four values at a time
    (a0..a3 b0..b3 a4..a7 ...), so that every 32-bit lane of an integer dot product covers one block."""
    j = torch.arange(PAIR)
    within = (j // 4 % 2) * BLOCK + (j // 8) * 4 + j % 4
    return (torch.arange(0, k, PAIR)[:, None] + within).reshape(-1)


def quantize_blocks(weight: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qweight, scales [N, K/32], mins [N, K/32]) for a float weight [N, K]; see block_quant.cpp.

    4 bits: w = d·q + m with q in 0..15, d = (max − min)/15, m = min, as in a GGUF's Q4_1 block (a
    weight that came from Q4_1 blocks is reproduced exactly, up to float rounding). 8 bits: w = d·q,
    q in −127..127, d = max|w|/127, as in Q8_0.
    """
    n, k = weight.shape
    blocks = weight.detach().float().reshape(n, k // BLOCK, BLOCK)
    if bits == 8:
        scales = blocks.abs().amax(-1) / 127
        q = torch.round(blocks / scales.clamp(min=1e-12)[..., None]).clamp(-127, 127).to(torch.int8)
        return q.reshape(n, k)[:, pair_order(k)].contiguous(), scales.contiguous(), torch.zeros(0)
    low, high = blocks.amin(-1), blocks.amax(-1)
    scales = (high - low) / 15
    q = (
        torch.round((blocks - low[..., None]) / scales.clamp(min=1e-12)[..., None])
        .clamp(0, 15)
        .to(torch.uint8)
    )
    pairs = q.reshape(n, k)[:, pair_order(k)].reshape(n, k // PAIR, PAIR)
    packed = pairs[..., :32] | (pairs[..., 32:] << 4)  # byte j: value j and value 32 + j of the pair
    return packed.reshape(n, k // 2).contiguous(), scales.contiguous(), low.contiguous()


def dequantize_blocks(
    qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bits: int
) -> torch.Tensor:
    """The float weight [N, K] that the blocks hold."""
    n, k = scales.shape[0], scales.shape[1] * BLOCK
    if bits == 8:
        values = qweight.float()
    else:
        packed = qweight.reshape(n, k // PAIR, 32)
        values = torch.cat([packed & 0x0F, packed >> 4], dim=-1).reshape(n, k).float()
    q = torch.empty_like(values)
    q[:, pair_order(k)] = values  # back to block order
    w = q.reshape(n, -1, BLOCK) * scales[..., None]
    if bits == 4:
        w = w + mins[..., None]
    return w.reshape(n, k)


class BlockQuantLinear(nn.Module):
    """An nn.Linear replacement holding block-quantized weights; float activations in and out.

    Built from the blocks (see quantize_blocks); `quantized` makes them from a float weight.
    """

    def __init__(self, qweight, scales, mins, bias: torch.Tensor | None, bits: int, path: str | None = None):
        super().__init__()
        self.out_features, self.in_features = scales.shape[0], scales.shape[1] * BLOCK
        self.bits, self.path = bits, path or best_path()
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("mins", mins)
        self.register_buffer("bias", bias)

    @classmethod
    def quantized(cls, weight: torch.Tensor, bias: torch.Tensor | None, bits: int) -> BlockQuantLinear:
        if weight.shape[1] % PAIR:
            raise ValueError(
                f"block quantization needs in_features divisible by {PAIR}, not {weight.shape[1]}"
            )
        bias = None if bias is None else bias.detach().float().clone()
        return cls(*quantize_blocks(weight, bits), bias, bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.tandem_block_quant.linear(
            x.reshape(-1, shape[-1]).float(), self.qweight, self.scales, self.mins, self.bits, self.path
        )
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features).to(x.dtype)

    def dequantized_weight(self) -> torch.Tensor:
        return dequantize_blocks(self.qweight, self.scales, self.mins, self.bits)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bits={self.bits}, path={self.path}"


def concatenated(layers: list[BlockQuantLinear]) -> BlockQuantLinear:
    """One layer computing `layers` side by side (their outputs concatenated), as a fused projection.

    The fused buffers are the only copy: each layer's own buffers become row slices of them.
    """
    first = layers[0]
    stacked = {}
    for name in ("qweight", "scales", "mins", "bias"):
        parts = [getattr(layer, name) for layer in layers]
        if parts[0] is None or parts[0].numel() == 0:  # no bias; 8-bit blocks have no offsets
            stacked[name] = parts[0]
            continue
        stacked[name] = whole = torch.cat(parts)
        start = 0
        for layer in layers:
            setattr(layer, name, whole[start : start + layer.out_features])
            start += layer.out_features
    return BlockQuantLinear(**stacked, bits=first.bits, path=first.path)


def shares_buffers(layers: list[BlockQuantLinear], fused: BlockQuantLinear) -> bool:
    """True when `layers` still point into `fused`'s weights (a second runner over the same model)."""
    start = 0
    for layer in layers:
        if layer.qweight.data_ptr() != fused.qweight[start].data_ptr():
            return False
        start += layer.out_features
    return start == fused.out_features
