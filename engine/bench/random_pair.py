"""Random-weight models built from published configs: real costs without the weights.

The GPU pairs the catalogue suggests (Qwen2.5-7B-Instruct with Qwen2.5-0.5B-Instruct), as their
config.json files give them, and "tiny" ones that run anywhere, for checking the harness itself.
"""

from __future__ import annotations

import copy

import torch

# Configs as published (config.json), written out by hand (the hub is out of reach here): the pairs
# the catalogue suggests on a GPU and the models engine.bench.real_sizes measures; "tiny" pairs run
# anywhere, for checking the harness itself.
CONFIGS = {
    "qwen2.5-7b": dict(
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": dict(
        model_type="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    "llama-3.1-8b": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "tiny": dict(
        model_type="qwen2",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=4096,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
    "tiny-draft": dict(
        model_type="qwen2",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=4000,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
}


class NumberedTokens:
    """Decodes ids as their numbers: random weights have no tokenizer, and the loop streams text."""

    def decode(self, ids, **_options) -> str:
        return "".join(f" {int(i)}" for i in ids)


def build_model(
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    vocab_size: int | None = None,
    untie: bool = False,
):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(CONFIGS[name])
    fields["vocab_size"] = vocab_size or fields["vocab_size"]
    fields["tie_word_embeddings"] = fields["tie_word_embeddings"] and not untie
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.use_sliding_window = False
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if not config.tie_word_embeddings:
        # Random init gives near-uniform logits; a sharper head makes argmaxes clear-cut, so greedy
        # comparisons test the loop rather than tie-breaking in the last bit.
        with torch.no_grad():
            model.lm_head.weight.mul_(8.0)
    return model.eval()


def model_bytes(model) -> int:
    seen, total = set(), 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def int4_copy(model):
    from engine.kernels.quant_kernels import KERNELS

    kernel = KERNELS["int4-weight-g32-cuda"]
    reason = kernel.unavailable_reason()
    if reason:
        raise RuntimeError(f"{kernel.name}: {reason}")
    return kernel.build(copy.deepcopy(model)).eval()
