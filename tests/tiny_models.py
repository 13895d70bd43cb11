"""Tiny random Llama models built from a config. Its own module, free of conftest's side effects
(conftest sets the suite's environment when imported, and a test importing it by name would run it again)."""

from __future__ import annotations


def build_tiny_llama(
    tokenizer, seed: int = 0, layers: int = 2, hidden: int = 64, vocab_size: int | None = None
):
    """A seeded random Llama small enough to run hundreds of forwards in a second."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size or len(tokenizer),
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init gives near-uniform logits; a larger scale on the head makes argmaxes clear-cut,
    # so greedy comparisons test the loop rather than fp32 tie-breaking.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()
