"""Memory estimates from configs, checked against loaded models."""

import pytest
from transformers import LlamaConfig, Qwen2Config

from engine.models.memory import (
    GIB,
    available_memory_bytes,
    estimate_memory,
    estimate_weight_bytes,
    kv_cache_bytes,
    model_memory_bytes,
)

TINY = LlamaConfig(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
)
QWEN_7B = Qwen2Config(
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    tie_word_embeddings=False,
)
QWEN_05B = Qwen2Config(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
)


def test_kv_cache_formula():
    # 2 (K, V) x 2 layers x 2 kv heads x 16 head dim x 100 tokens x 4 bytes
    assert kv_cache_bytes(TINY, 100, "float32") == 2 * 2 * 2 * 16 * 100 * 4
    assert kv_cache_bytes(TINY, 100, "bf16") == 2 * 2 * 2 * 16 * 100 * 2


def test_builtin_estimate_matches_loaded_parameters(builtin_model):
    measured = model_memory_bytes(builtin_model.model)
    estimate = estimate_weight_bytes(builtin_model.model.config, "none", "float32")
    assert abs(estimate - measured) <= 0.15 * measured


def test_builtin_pair_estimate_within_15_percent(builtin_model):
    config = builtin_model.model.config
    estimate = estimate_memory(config, config, context_length=512, draft_quantization="int8", device="cpu")
    measured_weights = builtin_model.info["memory_bytes"]
    assert abs(estimate.parts["target weights"] - measured_weights) <= 0.15 * measured_weights
    assert estimate.parts["draft weights"] < 0.5 * estimate.parts["target weights"]
    # a float target keeps its dtype in the cache (engine.runtime.kv_cache): float32 here
    assert estimate.parts["target KV cache"] == kv_cache_bytes(config, 512, "float32")


def test_qwen_pair_estimate_without_weights():
    estimate = estimate_memory(
        QWEN_7B,
        QWEN_05B,
        context_length=8192,
        device="cuda",
        target_dtype="bf16",
        draft_dtype="bf16",
        draft_quantization="int4",
        available={"cuda": 24 * GIB},
    )
    # Qwen2.5-7B holds 7.62 B parameters: about 15.2 GB in bf16.
    assert 14.0e9 < estimate.parts["target weights"] < 16.0e9
    assert estimate.parts["draft weights"] < 0.6e9
    assert estimate.parts["target KV cache"] == 2 * 28 * 4 * 128 * 8192 * 2
    assert estimate.verdict == "fits"
    assert "fits" in estimate.summary and "\n" not in estimate.summary


@pytest.mark.parametrize(("free_gib", "verdict"), [(8, "fits"), (1.1, "tight"), (0.5, "won't fit")])
def test_verdicts(free_gib, verdict):
    estimate = estimate_memory(
        QWEN_05B,
        context_length=4096,
        device="cpu",
        target_dtype="bf16",
        available={"cpu": int(free_gib * GIB)},
    )
    assert 0.9 * GIB < estimate.total_bytes < 1.2 * GIB
    assert estimate.verdict == verdict
    assert verdict in estimate.summary


def test_draft_on_cpu_is_counted_against_ram():
    estimate = estimate_memory(
        QWEN_7B,
        QWEN_05B,
        device="cuda",
        draft_device="cpu",
        target_dtype="bf16",
        draft_dtype="fp32",
        available={"cuda": 80 * GIB, "cpu": 1 * GIB},
    )
    assert estimate.devices["draft weights"] == "cpu"
    assert estimate.verdict == "won't fit"


def test_free_memory_is_read():
    assert available_memory_bytes("cpu") > 0


def test_the_estimate_is_at_the_context_the_engine_gives_the_target():
    """One context figure: the memory line counts the KV cache the runner allocates, not a guess."""
    from engine.settings import cache_tokens_for

    estimate = estimate_memory(QWEN_7B, QWEN_05B, device="cpu", available={"cpu": 64 * GIB})
    assert estimate.context_length == cache_tokens_for(QWEN_7B)
    assert f"{cache_tokens_for(QWEN_7B):,} tokens of context" in estimate.summary
