"""The fast path's KV buffers (engine.runtime.kv_cache): float16 where the row kernel reads a GGUF target's, at the
context chosen, and a clear refusal past it."""

from __future__ import annotations

import pytest
import torch

from engine.errors import ContextOverflowError, SettingsError
from engine.kernels.cpu_features import has_avx2, has_f16c
from engine.models.memory import estimate_memory, kv_cache_bytes
from engine.runtime.attention import attend_rows, rows_unavailable_reason
from engine.runtime.fastpath import FastRunner
from engine.runtime.kv_cache import cache_bytes
from engine.settings import DEFAULT_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS, cache_tokens_for

needs_kernel = pytest.mark.skipif(
    not (has_avx2() and has_f16c()), reason="this CPU has no AVX2 and F16C, where the row kernel runs"
)

KV, G, SLOTS = 2, 4, 83  # slots not a multiple of 8: a last block of keys reads the zero padding


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Attention in float64 over the first lengths[t] slots: q [T, H, D], k/v [1, KV, S, D] -> [T, H, D]."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.empty_like(q)
    for t, length in enumerate(lengths.tolist()):
        for h in range(q.shape[1]):
            keys, values = k[0, h // G, :length], v[0, h // G, :length]
            weights = torch.softmax(keys @ q[t, h] / q.shape[-1] ** 0.5, dim=0)
            out[t, h] = weights @ values
    return out


@needs_kernel
@pytest.mark.parametrize("head_dim", [64, 128])
def test_float16_kv_attention_is_the_float64_reference_within_float16_rounding(head_dim):
    assert rows_unavailable_reason() is None, rows_unavailable_reason()
    torch.manual_seed(head_dim)
    k, v = torch.randn(1, KV, SLOTS, head_dim), torch.randn(1, KV, SLOTS, head_dim)
    q = torch.randn(4, KV * G, head_dim)
    lengths = torch.tensor([1, 30, 77, SLOTS])
    k16, v16 = k.half(), v.half()
    got = attend_rows(q, k16, v16, lengths, None)
    # the kernel widens float16 exactly: the float32 kernel over the same rounded values, bit for bit
    assert torch.equal(got, attend_rows(q, k16.float(), v16.float(), lengths, None))
    # against float64 on the unrounded keys and values: float16's rounding (2^-11 relative) is all it adds
    expected = reference(q, k, v, lengths)
    error = (got.double() - expected).abs().max().item()
    assert error < 5e-3, error
    assert error > 0  # it did read rounded values: the float32 cache's error is about 1e-6
    assert (attend_rows(q, k, v, lengths, None).double() - expected).abs().max().item() < 1e-5


@needs_kernel
def test_a_gguf_targets_buffers_hold_the_chosen_context_in_float16(native_builtin):
    config = native_builtin.model.config
    context = 1000
    runner = FastRunner(
        native_builtin.model, compiled="off", max_seq_length=cache_tokens_for(config, context)
    )
    fast = runner.fast
    assert fast.row_attention and runner.context_length == context
    layers, kv_heads, head_dim = config.num_hidden_layers, config.num_key_value_heads, fast.head_dim
    assert {cache.k_cache.dtype for cache in fast.kv_caches} == {torch.float16}
    assert cache_bytes(fast.kv_caches) == layers * 2 * context * kv_heads * head_dim * 2
    # what the memory estimate counts for a GGUF file on its own blocks is what was allocated
    assert kv_cache_bytes(config, context, "float16") == cache_bytes(fast.kv_caches)
    estimate = estimate_memory(
        config, context_length=context, available={"cpu": 2**40}, target_weight_bytes=10**8
    )
    assert estimate.parts["target KV cache"] == cache_bytes(fast.kv_caches)


@needs_kernel
def test_a_float_targets_buffers_keep_its_dtype_so_it_stays_the_float_model(make_tiny):
    loaded = make_tiny(seed=3, hidden=128)  # head size 32, which the row kernel takes
    config = loaded.model.config
    config.max_position_embeddings = 4096
    runner = FastRunner(loaded.model, compiled="off", max_seq_length=cache_tokens_for(config, 1000))
    assert runner.fast.row_attention
    assert {cache.k_cache.dtype for cache in runner.fast.kv_caches} == {torch.float32}
    estimate = estimate_memory(config, context_length=1000, available={"cpu": 2**40})
    assert estimate.parts["target KV cache"] == cache_bytes(runner.fast.kv_caches)


def test_the_context_is_the_one_chosen_never_more_than_the_models_own(make_tiny):
    config = make_tiny(seed=3).model.config
    config.max_position_embeddings = 131072  # a Llama 3 model's own context
    assert cache_tokens_for(config) == DEFAULT_CONTEXT_TOKENS
    assert cache_tokens_for(config, 4096) == 4096
    config.max_position_embeddings = 2048
    assert cache_tokens_for(config) == 2048
    assert cache_tokens_for(config, 100_000) == 2048
    with pytest.raises(SettingsError, match="at least 256 tokens"):
        cache_tokens_for(config, 10)
    assert cache_tokens_for(config, MAX_CONTEXT_TOKENS) == 2048
    with pytest.raises(SettingsError, match="at most 1,048,576 tokens"):
        cache_tokens_for(config, MAX_CONTEXT_TOKENS + 1)


def test_a_conversation_past_the_chosen_context_is_refused_with_what_to_do(make_tiny):
    from engine.session import ChatEngine

    loaded = make_tiny(seed=4)
    loaded.model.config.max_position_embeddings = 1024
    engine = ChatEngine(loaded, None, compiled="off", context=300)
    assert engine.context_length == 300
    with pytest.raises(ContextOverflowError, match=r"300 tokens long, but the context you chose holds 300"):
        engine.generate_ids([5] * 300)
    with pytest.raises(ContextOverflowError, match=r"up to 1,024 .*Context in the app's Settings, --context"):
        engine.generate_ids([5] * 300)
    finished = engine.generate_ids([5] * 290)  # fits: the reply stops at the context's end
    assert 1 <= len(finished.token_ids) <= 10
