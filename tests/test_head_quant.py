"""The draft head in 8-bit blocks: smaller, checked against its float self on this machine, and
refused when it disagrees. (Greedy equality with the target alone, with the head as it runs here, is
test_head.test_greedy_output_with_the_shipped_head_is_the_targets.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.heads import quant as head_quant
from engine.heads.head import find_head, load_head
from engine.kernels import block_quant


@pytest.fixture
def fresh_check_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def shipped_head(builtin_model):
    return load_head(find_head(builtin_model), builtin_model.model)


def weight_bytes(module: nn.Module) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def test_the_shipped_head_runs_in_8_bit_blocks_that_agree_with_its_float_self(
    builtin_model, shipped_head, fresh_check_cache
):
    assert block_quant.build_error() is None, "the block kernel did not build here"
    head, note = head_quant.quantized_if_agrees(shipped_head, builtin_model)
    assert head is not shipped_head and "Draft head in 8-bit blocks" in note
    layers = [m for m in head.modules() if isinstance(m, block_quant.BlockQuantLinear)]
    attn, mlp = head.midlayer.self_attn, head.midlayer.mlp
    expected = [head.lm_head, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
    assert {id(m) for m in layers} == {id(m) for m in expected + [mlp.gate_proj, mlp.up_proj, mlp.down_proj]}
    assert type(head.fc) is nn.Linear  # over many rows of features at once: float is faster there
    # all but fc and the norms, now at about a quarter of their bytes
    assert weight_bytes(head) < 0.45 * weight_bytes(shipped_head)
    # the cached figure is the one this machine measured, and a second load reads it back
    measured = head_quant.agreement(shipped_head, head, builtin_model)
    assert measured >= head_quant.MIN_AGREEMENT
    assert f"{measured:.0%}" in note
    _, again = head_quant.quantized_if_agrees(shipped_head, builtin_model)
    assert again == note


def test_an_8_bit_head_that_disagrees_with_its_float_self_is_not_used(
    builtin_model, shipped_head, fresh_check_cache, monkeypatch
):
    """Negative control: a kernel that scrambles the weights (rows shuffled) must fail the check."""
    real_copy = head_quant.quantized_copy

    def scrambled_copy(head):
        quantized = real_copy(head)
        layer = quantized.lm_head
        order = torch.randperm(layer.qweight.size(0), generator=torch.Generator().manual_seed(0))
        layer.qweight.copy_(layer.qweight[order])
        return quantized

    monkeypatch.setattr(head_quant, "quantized_copy", scrambled_copy)
    head, note = head_quant.quantized_if_agrees(shipped_head, builtin_model)
    assert head is shipped_head
    assert "float32" in note and "needs 95%" in note


def test_a_head_the_kernel_cannot_hold_stays_float_and_says_why(make_tiny):
    from tests.test_head import random_head

    tiny = make_tiny(seed=0, layers=2, hidden=48)  # 48 is not a multiple of the kernel's 64
    head = random_head(tiny.model, 64)
    kept, note = head_quant.quantized_if_agrees(head, tiny)
    assert kept is head
    assert note == "Draft head in float32 (its layers' widths are not multiples of 64)."


def test_a_prepared_engine_has_its_head_loaded_and_says_at_what_precision_it_runs(
    builtin_model, fresh_check_cache
):
    from engine.session import ChatEngine
    from engine.settings import SpeculationSettings

    engine = ChatEngine(builtin_model, speculation=SpeculationSettings(drafter="auto"), compiled="off")
    engine.prepare()
    assert engine._head is not None  # loaded and checked before the first reply, not during it
    assert any(notice.startswith("Draft head in 8-bit blocks") for notice in engine.notices)
