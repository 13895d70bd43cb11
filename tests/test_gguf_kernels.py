"""The kernels on a GGUF file's own blocks (engine/kernels/native/gguf_quant.cpp), checked on this machine
against the gguf package's own dequantization, for every block type and every code path this CPU runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from engine.kernels import gguf_quant as gq

pytestmark = pytest.mark.skipif(
    gq.build_error() is not None, reason="Tandem's CPU kernels are not built here"
)


def runnable_paths() -> list[str]:
    order = list(gq.PATHS)
    return order[order.index(gq.best_path()) :]


def random_blocks(name: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Random bytes in the type's block layout, with sane fp16 scales: any bytes are valid blocks."""
    rng = np.random.default_rng(seed)
    values, size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    raw = rng.integers(0, 256, size=(rows, k // values, size), dtype=np.uint8)

    def halves(low: float, high: float) -> np.ndarray:
        return rng.uniform(low, high, size=(rows, k // values, 1)).astype(np.float16).view(np.uint8)

    fields = {
        "Q4_0": [(0, 0.001, 0.02)],
        "Q5_0": [(0, 0.001, 0.02)],
        "Q8_0": [(0, 0.001, 0.02)],
        "Q4_1": [(0, 0.001, 0.02), (2, -0.1, 0.0)],
        "Q5_1": [(0, 0.001, 0.02), (2, -0.1, 0.0)],
        "Q4_K": [(0, 0.0001, 0.002), (2, 0.0001, 0.002)],
        "Q5_K": [(0, 0.0001, 0.002), (2, 0.0001, 0.002)],
        "Q6_K": [(208, 0.0001, 0.002)],
    }[name]
    for offset, low, high in fields:
        raw[..., offset : offset + 2] = halves(low, high)
    return raw.reshape(rows, -1)


def activation_block(name: str) -> int:
    """The K-quants take activations in blocks of 256 (ggml's Q8_K), the others in blocks of 32."""
    return 256 if name.endswith("_K") else 32


def quantized_reference(x: torch.Tensor, weight: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x's INT8 blocks (as the kernel rounds them) times the float weight, in float64."""
    m, k = x.shape
    blocks = x.reshape(m, k // block, block)
    amax = blocks.abs().amax(-1, keepdim=True)
    inverse = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inverse).clamp(-127, 127)
    return (q.double() * (amax / 127).double()).reshape(m, k) @ weight.double().T


def layer_for(name: str, rows: int, k: int, seed: int = 0) -> tuple[gq.GGUFLinear, torch.Tensor]:
    raw = random_blocks(name, rows, k, seed)
    block_type = gq.TYPE_IDS[name]
    weight = torch.from_numpy(dequantize(raw, block_type).astype(np.float32).reshape(rows, k))
    return gq.GGUFLinear(torch.from_numpy(raw), block_type, k), weight


def in_features(name: str) -> int:
    # 256-value types need whole super-blocks; 352 = 11 blocks of 32 exercises an odd last block
    return 512 if name.endswith("_K") else 352


@pytest.mark.parametrize("name", gq.BLOCK_TYPES)
def test_dequantized_rows_are_the_gguf_packages_own(name):
    layer, weight = layer_for(name, 40, in_features(name))
    assert torch.equal(layer.dequantized_weight(), weight)


@pytest.mark.parametrize("path", runnable_paths())
@pytest.mark.parametrize("name", gq.BLOCK_TYPES)
def test_linear_matches_the_float_weights_and_each_row_is_its_one_row_result(name, path):
    layer, weight = layer_for(name, 70, in_features(name))
    layer.path = path
    x = torch.randn(9, layer.in_features, generator=torch.Generator().manual_seed(1))
    y = layer(x)
    reference = quantized_reference(x, weight, activation_block(name))
    assert ((y.double() - reference).abs().max() / reference.abs().max()).item() < 1e-5
    # row-exact: the same bits whether a row comes alone or with others
    assert torch.equal(torch.cat([layer(x[i : i + 1]) for i in range(9)]), y)


@pytest.mark.parametrize("path", runnable_paths())
@pytest.mark.parametrize(
    "name, byte, bit",
    [
        ("Q4_K", 100, 0x10),  # one nibble of one row
        ("Q4_K", 5, 0x01),  # one sub-block's scale
        ("Q4_K", 9, 0x01),  # one sub-block's min
        ("Q5_K", 20, 0x04),  # one high bit
        ("Q6_K", 150, 0x20),  # one 2-bit high part
        ("Q6_K", 195, 0x01),  # one scale of 16 values
    ],
)
def test_the_check_catches_a_wrong_block(name, byte, bit, path):
    """The comparison above is sharp enough to see one changed bit of one block, on every path."""
    layer, weight = layer_for(name, 8, 512)
    layer.path = path
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(2))
    reference = quantized_reference(x, weight, activation_block(name))
    assert ((layer(x).double() - reference).abs().max() / reference.abs().max()).item() < 1e-5
    layer.blocks[3, byte] ^= bit
    error = (layer(x).double() - reference).abs().max() / reference.abs().max()
    assert error.item() > 1e-5


@pytest.mark.parametrize("path", runnable_paths())
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K", "Q8_0"])
def test_every_row_count_of_a_verify_gives_each_row_its_one_row_result(name, path):
    """1..18 rows: every tile shape (one to eight activation rows beside one, two or four weight rows)
    and the tiles of more than eight rows give each row the bits it gets alone."""
    layer, weight = layer_for(name, 37, in_features(name), seed=5)  # 37: a tail of odd weight rows
    layer.path = path
    x = torch.randn(18, layer.in_features, generator=torch.Generator().manual_seed(6))
    alone = torch.cat([layer(x[i : i + 1]) for i in range(18)])
    reference = quantized_reference(x, weight, activation_block(name))
    assert ((alone.double() - reference).abs().max() / reference.abs().max()).item() < 1e-5
    for m in range(2, 19):
        assert torch.equal(layer(x[:m]), alone[:m]), m


@pytest.mark.parametrize("path", runnable_paths())
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_long_rows_read_in_passes_keep_each_rows_one_row_result(name, path):
    """Rows longer than L1 holds for a verify's activations (17 blocks of 256 here) are read in passes
    over groups of weight rows (70: two groups of 32 and a tail); each row keeps its one-row bits."""
    layer, weight = layer_for(name, 70, 17 * 256, seed=7)
    layer.path = path
    x = torch.randn(9, layer.in_features, generator=torch.Generator().manual_seed(8))
    alone = torch.cat([layer(x[i : i + 1]) for i in range(9)])
    reference = quantized_reference(x, weight, activation_block(name))
    assert ((alone.double() - reference).abs().max() / reference.abs().max()).item() < 1e-5
    for m in range(2, 10):
        assert torch.equal(layer(x[:m]), alone[:m]), m


@pytest.mark.parametrize("path", runnable_paths())
@pytest.mark.parametrize(
    "names",
    [("Q4_K", "Q4_K", "Q6_K"), ("Q8_0", "Q5_K", "Q4_0")],
    ids=["Q4_K_M", "blocks-of-32-and-256"],
)
def test_parts_of_different_types_side_by_side_equal_each_part_alone(path, names):
    """A fused q/k/v whose parts are Q4_K, Q4_K and Q6_K (as a Q4_K_M file stores them), and one whose
    parts take activations in blocks of 32 and of 256 in one call."""
    layers = [
        layer_for(name, rows, 512, seed)[0]
        for seed, (name, rows) in enumerate(zip(names, (64, 16, 16), strict=True))
    ]
    for layer in layers:
        layer.path = path
    fused = gq.GGUFParts(layers)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(3))
    assert torch.equal(fused(x), torch.cat([layer(x) for layer in layers], dim=-1))


def test_many_rows_take_the_same_path_as_one():
    """A prompt's chunk of 100 rows: each row still equals its one-row result."""
    layer, _ = layer_for("Q5_0", 48, 352)
    x = torch.randn(100, 352, generator=torch.Generator().manual_seed(4))
    y = layer(x)
    assert torch.equal(y[37:38], layer(x[37:38]))
    assert torch.equal(y[99:], layer(x[99:]))


def test_an_embedding_returns_the_rows_it_is_asked_for():
    raw = random_blocks("Q8_0", 50, 64)
    embedding = gq.GGUFEmbedding(torch.from_numpy(raw), gq.TYPE_IDS["Q8_0"], 64, scale=2.0)
    weight = torch.from_numpy(dequantize(raw, gq.TYPE_IDS["Q8_0"]).astype(np.float32).reshape(50, 64))
    ids = torch.tensor([[3, 49, 0]])
    assert torch.equal(embedding(ids), weight[ids] * 2.0)


def test_blocks_that_do_not_hold_the_row_are_refused():
    raw = torch.from_numpy(random_blocks("Q4_0", 4, 64))
    with pytest.raises(ValueError, match="do not hold"):
        gq.GGUFLinear(raw, gq.TYPE_IDS["Q4_0"], 96)
    with pytest.raises(ValueError, match="no kernel"):
        gq.GGUFLinear(raw, 10, 64)  # Q2_K
