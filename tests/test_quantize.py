"""Quantized drafts: each mode that runs here loads, generates, shrinks, and mostly agrees with fp32."""

import pytest
import torch
from torch import nn

from engine.errors import SettingsError
from engine.kernels.quant_check import MIN_AGREEMENT, check_against, probe_inputs, reference_run
from engine.kernels.quant_kernels import KERNELS, candidates, int4_cpu_unavailable_reason
from engine.models.builtin import DEFAULT_TARGET
from engine.models.loading import load_config, load_model
from engine.models.memory import estimate_weight_bytes
from engine.models.quantize import (
    _reloader,
    precision_note,
    quantization_note,
    quantize_model,
)

PROMPT = "The capital of France is"
TOKENS = 8

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def greedy_tokens(loaded, count: int = TOKENS) -> list[int]:
    inputs = loaded.tokenizer(PROMPT, return_tensors="pt").to(loaded.device)
    out = loaded.model.generate(**inputs, max_new_tokens=count, min_new_tokens=count, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def agreement(a: list[int], b: list[int]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


@pytest.fixture(scope="module")
def fp32_tokens(builtin_model):
    return greedy_tokens(builtin_model)


def test_unknown_mode_is_a_settings_error(builtin_model):
    with pytest.raises(SettingsError, match="none, int8 or int4"):
        quantize_model(builtin_model, "int3")


def test_notes_for_the_settings_panel():
    cpu = torch.device("cpu")
    assert quantization_note("none", cpu) == ""
    assert "quarter of fp32's memory" in quantization_note("int8", cpu)
    assert "eighth of fp32's memory" in quantization_note("int4", cpu)
    assert "NF4" in quantization_note("int4", "cuda")


def test_the_fast_paths_kernel_comes_before_a_faster_measured_one(builtin_model, monkeypatch):
    """The layer microbenchmark ranked int8-dynamic-x86 first on an AVX-512 EPYC, and the INT8 target
    decoded at 56 tok/s on it against 92 on the block kernel, which the compiled fast path runs."""
    from engine.kernels import block_quant, kernel_speed

    def block_kernels_last(kernels, *args):
        return {k.name: 99.0 if k.fast_path else 1.0 for k in kernels}

    monkeypatch.setattr(kernel_speed, "ranked_by_speed", block_kernels_last)
    int8 = quantize_model(builtin_model, "int8")
    if block_quant.best_path() == "portable":  # no vector code path: the block kernel is no faster in use
        assert not KERNELS[int8.info["kernel"]].fast_path
    else:
        assert int8.info["kernel"] == "int8-block-q8_0"
        assert int8.info["kernel_reason"].startswith("the kernel the compiled fast path runs")


@pytest.mark.slow
def test_cpu_int8_copy(builtin_model, fp32_tokens):
    """The INT8 copy uses the kernel Tandem chose on this machine, and that kernel passed the check."""
    int8 = quantize_model(builtin_model, "int8")
    assert int8.quantization == "int8" and int8.model is not builtin_model.model
    chosen = KERNELS[int8.info["kernel"]]
    assert chosen in candidates("int8", "cpu") and chosen.unavailable_reason() is None
    check = int8.info["kernel_check"]
    assert check["passed"] and check["agreement"] >= MIN_AGREEMENT["int8"] and check["tokens"] > 150
    assert int8.info["kernel"] in int8.info["quantization_note"] and int8.info["kernel_reason"]
    # The original keeps its float head tied to the embedding; the copy's head is INT8.
    assert type(builtin_model.model.lm_head) is nn.Linear
    assert builtin_model.model.lm_head.weight is builtin_model.model.model.embed_tokens.weight
    assert type(int8.model.lm_head) is not nn.Linear
    assert int8.model.model.embed_tokens.weight.dtype == torch.float32
    assert int8.info["memory_bytes"] < 0.5 * int8.info["memory_bytes_before"]
    assert int8.info["memory_bytes_before"] == builtin_model.info["memory_bytes"]
    estimate = estimate_weight_bytes(builtin_model.model.config, "int8")
    assert abs(estimate - int8.info["memory_bytes"]) <= 0.15 * int8.info["memory_bytes"]
    assert agreement(greedy_tokens(int8), fp32_tokens) >= 0.6


@pytest.mark.slow
def test_cpu_int4_copy(fp32_tokens):
    int4 = load_model(DEFAULT_TARGET, device="cpu", quantization="int4")
    assert int4.quantization == "int4" and int4.info["precision"] == "int4"
    assert int4.info["kernel_check"]["passed"]
    assert int4.info["quantization_note"].startswith("INT4 weights take an eighth of fp32's memory.")
    assert int4.info["kernel"] in int4.info["quantization_note"]
    # the float embedding stays; int4-block-q4_1 keeps the LM head in INT8 blocks as Q4_1 files do
    assert int4.info["memory_bytes"] < 0.45 * int4.info["memory_bytes_before"]
    estimate = estimate_weight_bytes(load_config(DEFAULT_TARGET), "int4")
    if int4.info["kernel"] == "int4-weight-g32":
        assert abs(estimate - int4.info["memory_bytes"]) <= 0.15 * int4.info["memory_bytes"]
    assert agreement(greedy_tokens(int4), fp32_tokens) >= 0.6


@pytest.mark.slow
@pytest.mark.skipif(
    int4_cpu_unavailable_reason() is not None, reason="bitsandbytes NF4 does not run on this CPU"
)
def test_cpu_int4_via_bitsandbytes(builtin_model):
    """bitsandbytes NF4 on CPU runs and is measured by the same check (0.69 agreement measured on an
    AVX-512 machine, just under the INT4 bar, so there it is refused in favour of int4-weight-g32)."""
    reload = _reloader(builtin_model.path, builtin_model.device, builtin_model.dtype)
    probes = probe_inputs(builtin_model.tokenizer, builtin_model.device)
    _maxima, reference = reference_run(builtin_model.model, probes)
    result = check_against(reference, reload(KERNELS["int4-nf4-bnb"]), probes, "int4")
    assert result.agreement >= 0.6 and result.passed == (result.agreement >= MIN_AGREEMENT["int4"])


@pytest.mark.slow
def test_target_precision_int8_is_not_the_fp32_target(builtin_model):
    int8 = load_model(DEFAULT_TARGET, device="cpu", precision="int8")
    assert int8.info["precision"] == "int8" and int8.quantization == "int8"
    assert builtin_model.info["precision"] == "fp32"
    assert "not identical" in precision_note("int8", int8.device)
    assert "Drafting stays exact on the CPU block kernels" in precision_note("int4", int8.device)


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_cuda_bitsandbytes_draft(mode):
    import bitsandbytes as bnb

    fp = load_model(DEFAULT_TARGET, device="cuda")
    quantized = load_model(DEFAULT_TARGET, device="cuda", quantization=mode)
    assert quantized.device.type == "cuda" and quantized.dtype in (torch.bfloat16, torch.float16)
    layer_type = bnb.nn.Linear8bitLt if mode == "int8" else bnb.nn.Linear4bit
    assert isinstance(quantized.model.model.layers[0].mlp.up_proj, layer_type)
    assert quantized.info["memory_bytes"] < 0.75 * quantized.info["memory_bytes_before"]
    estimate = estimate_weight_bytes(quantized.model.config, mode, quantized.dtype, "cuda")
    assert abs(estimate - quantized.info["memory_bytes"]) <= 0.15 * quantized.info["memory_bytes"]
    assert agreement(greedy_tokens(quantized), greedy_tokens(fp)) >= 0.5


@pytest.mark.cuda
@cuda_only
def test_cuda_quantize_model_reloads_from_the_folder():
    fp = load_model(DEFAULT_TARGET, device="cuda")
    int4 = quantize_model(fp, "int4")
    assert int4.spec == fp.spec and int4.quantization == "int4"
    assert len(greedy_tokens(int4, 4)) == 4


def test_auto_drafts_in_int4_where_the_targets_weights_are_4bit_blocks_already(builtin_model, make_tiny):
    from engine.kernels.block_quant import (
        build_error,
        dequantize_blocks,
        holds_in_4bit_blocks,
        quantize_blocks,
    )
    from engine.kernels.kernel_choice import copy_mode
    from engine.models.pair import load_pair

    assert build_error() is None, build_error()
    # the built-in model is read from a Q4_1 GGUF: a 4-bit copy holds its layers' very weights
    assert holds_in_4bit_blocks(builtin_model.model)
    assert copy_mode(builtin_model.model, "cpu") == "int4"
    tiny = make_tiny()
    assert not holds_in_4bit_blocks(tiny.model)
    assert copy_mode(tiny.model, "cpu") == "int8"
    with torch.no_grad():  # the same model with its weights put through 4-bit blocks
        for linear in tiny.model.modules():
            if type(linear) is nn.Linear:
                linear.weight.copy_(dequantize_blocks(*quantize_blocks(linear.weight, 4), 4))
    assert holds_in_4bit_blocks(tiny.model)
    assert copy_mode(tiny.model, "cpu") == "int4"
    target, draft = load_pair(DEFAULT_TARGET, None, device="cpu", target_precision="fp32")
    assert draft.quantization == "int4"
    native, no_copy = load_pair(DEFAULT_TARGET, None, device="cpu")  # the file's own blocks are the target
    assert native.quantization == "gguf" and no_copy is None
    # the app names the copy by the target's own spec
    assert load_pair(DEFAULT_TARGET, DEFAULT_TARGET, device="cpu")[1] is None
