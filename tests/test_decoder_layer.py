"""A float decoder layer in one call (engine/kernels/native/decoder_layer.cpp) against the same layer op by op,
its row exactness, and its cache writes."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.cpu_features import cpu_flags, has_avx2
from engine.runtime.fused_layer import kernel_name, layer_kernel_unavailable_reason
from engine.runtime.row_linear import EXACT_ROWS
from engine.runtime.static_forward import FastLlama

pytestmark = [
    pytest.mark.skipif(not has_avx2(), reason="this CPU has no AVX2, where Tandem's float kernels run"),
    pytest.mark.usefixtures("kernel_built"),
]

SLOTS = 64
# Every code path this CPU can run, not only the one it would pick: an AVX-512 machine checks the
# AVX2 path that AVX2-only machines take.
FLOAT_PATHS = ["avx2"] + (["avx512"] if "avx512f" in cpu_flags() else [])
BLOCK_PATHS = ["avx2"] + (["vnni"] if {"avx512_vnni", "avx512vl"} <= cpu_flags() else [])


def tiny_model(family: str, seed: int = 0, intermediate: int = 204):
    """Two layers, head size 32 (one the row attention takes), by default an MLP width that is no
    multiple of 8."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    config = (LlamaConfig if family == "llama" else Qwen2Config)(
        hidden_size=128,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        max_position_embeddings=SLOTS,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # norms other than ones, and Qwen2's q/k/v biases not zero
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
            if family == "qwen2":
                layer.self_attn.q_proj.bias.normal_()
                layer.self_attn.k_proj.bias.normal_()
    return model


def one_call(fast: FastLlama, on: bool) -> None:
    for layer in fast.fused:
        layer.one_call = on
    for cache in fast.kv_caches:
        cache.k_cache.zero_()
        cache.v_cache.zero_()


def on_path(fast: FastLlama, path: str) -> None:
    """Every layer of `fast` on the kernels' code path `path`, float or block-quantized."""
    from engine.kernels.block_quant import BlockQuantLinear

    for layer in fast.fused:
        if layer.qkv_quant is None:
            layer.linear_path = path
        for module in (layer.qkv_quant, layer.gate_up_quant, layer.o_proj, layer.down_proj):
            if isinstance(module, BlockQuantLinear):
                module.path = path


def prompt_then_steps(fast: FastLlama, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    """Logits of a prompt forward over ids[:prompt], then one-token steps over the rest."""
    with torch.inference_mode():
        hidden, _ = fast(ids[:, :prompt], torch.arange(prompt), None, window=prompt)
        rows = [fast.logits(hidden)[0]]
        for t in range(prompt, ids.shape[1]):
            hidden, _ = fast(ids[:, t : t + 1], torch.tensor([t]), None, window=t + 1)
            rows.append(fast.logits(hidden)[0])
    return torch.cat(rows)


# Logits' and cached values' tolerance per KV dtype: float16 buffers round each key and value to 11
# bits, so a value a step apart in float32 may round one float16 step apart (2^-10 relative)
LOGITS_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3}
CACHE_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3}


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("path", FLOAT_PATHS)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_one_call_computes_the_layer_as_its_ops_do_and_writes_the_same_cache(family, path, kv_dtype):
    model = tiny_model(family)
    fast = FastLlama(model, SLOTS, kv_dtype)
    assert fast.kv_caches[0].k_cache.dtype == kv_dtype
    tol, cache_tol = LOGITS_TOLERANCE[kv_dtype], CACHE_TOLERANCE[kv_dtype]
    assert fast.row_attention and fast.fused is not None and all(layer.one_call for layer in fast.fused)
    on_path(fast, path)
    ids = torch.randint(0, 300, (1, 23), generator=torch.Generator().manual_seed(1))
    one_call(fast, False)
    expected = prompt_then_steps(fast, ids, 15)
    caches = [(c.k_cache.clone(), c.v_cache.clone()) for c in fast.kv_caches]
    one_call(fast, True)
    actual = prompt_then_steps(fast, ids, 15)
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)
    for (k, v), cache in zip(caches, fast.kv_caches, strict=True):
        torch.testing.assert_close(cache.k_cache, k, atol=cache_tol, rtol=cache_tol)
        torch.testing.assert_close(cache.v_cache, v, atol=cache_tol, rtol=cache_tol)
    with torch.inference_mode():
        reference = model(ids).logits[0]
    torch.testing.assert_close(actual, reference, atol=tol, rtol=tol)


def all_rows_in_one_forward(fast, ids) -> torch.Tensor:
    """The logits of every position of `ids`, read by one forward from an empty cache."""
    with torch.inference_mode():
        hidden, _ = fast(ids, torch.arange(ids.shape[1]), None, window=ids.shape[1])
        return fast.logits(hidden)[0]


@pytest.mark.parametrize("path", FLOAT_PATHS)
def test_rows_at_once_are_the_one_token_steps_bit_for_bit(path):
    fast = FastLlama(tiny_model("llama", seed=2), SLOTS)
    on_path(fast, path)
    rows = min(20, EXACT_ROWS[path])  # the most rows a call of this path computes row by row
    ids = torch.randint(0, 300, (1, rows), generator=torch.Generator().manual_seed(3))
    one_call(fast, True)
    steps = prompt_then_steps(fast, ids, 1)
    one_call(fast, True)
    assert torch.equal(all_rows_in_one_forward(fast, ids), steps)


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
def test_a_token_tree_attends_as_its_mask_says(kv_dtype):
    """Two siblings at one position, in two slots: each sees the prompt and itself, not the other."""
    model = tiny_model("qwen2", seed=4)
    fast = FastLlama(model, SLOTS, kv_dtype)
    tol = LOGITS_TOLERANCE[kv_dtype]
    prompt = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(5))
    siblings = torch.tensor([[17, 230]])
    positions, slots = torch.tensor([9, 9]), torch.tensor([9, 10])
    visible = torch.zeros(2, 11, dtype=torch.bool)
    visible[:, :9] = True
    visible[0, 9] = visible[1, 10] = True
    outputs = {}
    for on in (False, True):
        one_call(fast, on)
        with torch.inference_mode():
            fast(prompt, torch.arange(9), None, window=9)
            hidden, _ = fast(siblings, positions, visible, slots=slots, window=11)
            outputs[on] = fast.logits(hidden)[0]
    torch.testing.assert_close(outputs[True], outputs[False], atol=tol, rtol=tol)
    with torch.inference_mode():  # each sibling as the one continuation of the prompt
        for row, token in enumerate(siblings[0].tolist()):
            alone = model(torch.cat([prompt, torch.tensor([[token]])], dim=1)).logits[0, -1]
            torch.testing.assert_close(outputs[True][row], alone, atol=tol, rtol=tol)


def test_turned_off_the_layers_run_op_by_op(monkeypatch):
    model = tiny_model("llama")
    assert kernel_name(model) == "one-call-v2" and kernel_name(model, versioned=False) == "one-call"
    monkeypatch.setenv("TANDEM_LAYER_KERNEL", "off")
    layer_kernel_unavailable_reason.cache_clear()
    try:
        assert kernel_name(model) == "op-by-op"
        assert not any(layer.one_call for layer in FastLlama(model, SLOTS).fused)
    finally:
        monkeypatch.delenv("TANDEM_LAYER_KERNEL")
        layer_kernel_unavailable_reason.cache_clear()
        assert layer_kernel_unavailable_reason() is None


def block_quantized(model, bits: int):
    """Every projection of `model` in `bits`-bit blocks (engine.kernels.block_quant), as a quantized draft."""
    from engine.kernels.block_quant import BlockQuantLinear

    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    bias = None if child.bias is None else child.bias.detach()
                    setattr(parent, name, BlockQuantLinear.quantized(child.weight.detach(), bias, bits))
    return model


@pytest.mark.parametrize("path", BLOCK_PATHS)
@pytest.mark.parametrize("bits", [4, 8])
def test_block_quantized_layers_run_in_one_call_and_their_rows_stay_exact(bits, path):
    from engine.kernels.block_quant import build_error

    assert build_error() is None, build_error()
    model = block_quantized(tiny_model("qwen2", seed=6, intermediate=192), bits)
    fast = FastLlama(model, SLOTS)
    assert fast.fused is not None and all(layer.one_call for layer in fast.fused), fast.unfused_reason
    on_path(fast, path)
    ids = torch.randint(0, 300, (1, 20), generator=torch.Generator().manual_seed(7))
    one_call(fast, False)
    op_by_op = prompt_then_steps(fast, ids, 1)
    one_call(fast, True)
    steps = prompt_then_steps(fast, ids, 1)
    one_call(fast, True)
    assert torch.equal(all_rows_in_one_forward(fast, ids), steps)
    # the layer's ops, as the op-by-op path computes them (here no activation lands on another
    # rounding step of the blocks, where the two could part)
    torch.testing.assert_close(steps, op_by_op, atol=1e-5, rtol=1e-5)
