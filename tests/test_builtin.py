"""The built-in model: found in its package, converted once, and equal to the GGUF it came from."""

import pytest
import torch

from engine.errors import ModelNotFoundError
from engine.models.builtin import (
    DEFAULT_TARGET,
    builtin_entry,
    builtin_gguf_path,
    convert_gguf_to_folder,
    ensure_builtin,
    is_converted,
)


def test_unknown_builtin_names_the_known_ones():
    with pytest.raises(ModelNotFoundError, match="smollm2-135m-instruct"):
        builtin_entry("builtin:nope")


def test_ensure_builtin_reuses_the_converted_folder(builtin_folder):
    assert is_converted(builtin_folder)
    stamp = (builtin_folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_builtin(DEFAULT_TARGET) == builtin_folder
    assert (builtin_folder / "model.safetensors").stat().st_mtime_ns == stamp


def test_builtin_model_generates(builtin_model):
    tokenizer = builtin_model.tokenizer
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = builtin_model.model.generate(**prompt, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in text


@pytest.mark.slow
def test_conversion_keeps_the_gguf_logits(tmp_path, builtin_folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = builtin_gguf_path(builtin_entry(DEFAULT_TARGET))
    stages = []
    folder = convert_gguf_to_folder(gguf, tmp_path / "converted", lambda s, d, t: stages.append((s, d, t)))
    assert is_converted(folder) and not (tmp_path / "converted.partial").exists()
    assert stages[-1][1] == stages[-1][2]

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = tokenizer("The quick brown fox jumps over", return_tensors="pt").input_ids
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    converted = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        expected = direct(ids).logits
        actual = converted(ids).logits
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=0)
