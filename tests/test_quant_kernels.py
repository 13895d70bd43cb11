"""Quantized kernels: the check refuses a wrong kernel, every kernel that runs here agrees with fp32,
and the choice and its check are cached per machine."""

import copy
import dataclasses
import json

import pytest
import torch

from engine.errors import SettingsError
from engine.kernels import quant_check as qc
from engine.kernels import quant_kernels as qk
from engine.kernels.quant_smoothing import fold_smoothing, input_channel_maxima
from engine.models.quantize import precision_settings, quantize_checked
from tests.tiny_models import build_tiny_llama


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test gets its own cache folder, so a check is really run (and models still load)."""
    from engine.paths import models_cache_dir

    models = models_cache_dir()
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    (tmp_path / "models").symlink_to(models, target_is_directory=True)


def broken_int8(weight, bias):
    """Weight-only INT8 whose row scales are perturbed: a kernel that runs but computes wrong numbers."""
    layer = qk.Int8WeightOnlyLinear(weight, bias)
    generator = torch.Generator().manual_seed(0)
    factors = torch.empty(layer.scale.shape).uniform_(-3.0, 3.0, generator=generator)
    layer.scale.mul_(factors)
    return layer


BROKEN = qk.Kernel("int8-broken-scales", "int8", "cpu", "weight-only INT8, scales perturbed", broken_int8)
GOOD = qk.KERNELS["int8-weight"]


@pytest.fixture(scope="module")
def tiny_llama(builtin_tokenizer):
    return build_tiny_llama(builtin_tokenizer, seed=3, layers=2, hidden=64)


def test_the_check_refuses_a_broken_kernel_and_takes_the_next(tiny_llama, builtin_tokenizer):
    model, info = quantize_checked(
        copy.deepcopy(tiny_llama), builtin_tokenizer, "int8", torch.device("cpu"), kernels=[BROKEN, GOOD]
    )
    assert info["kernel"] == "int8-weight"
    assert isinstance(model.lm_head, qk.Int8WeightOnlyLinear)
    refused = {r["kernel"]: r for r in info["kernels_refused"]}
    assert "failed the check" in refused["int8-broken-scales"]["reason"]
    assert refused["int8-broken-scales"]["check"]["agreement"] < qc.MIN_AGREEMENT["int8"]
    assert "int8-broken-scales" in info["kernel_reason"] and "int8-broken-scales" in info["quantization_note"]
    assert info["kernel_check"]["passed"] and info["kernel_check"]["agreement"] >= qc.MIN_AGREEMENT["int8"]


def test_only_a_broken_kernel_is_a_settings_error(tiny_llama, builtin_tokenizer):
    with pytest.raises(SettingsError, match="No INT8 kernel runs correctly.*int8-broken-scales"):
        quantize_checked(
            copy.deepcopy(tiny_llama), builtin_tokenizer, "int8", torch.device("cpu"), kernels=[BROKEN]
        )


def test_checks_are_cached_per_kernel_version(tiny_llama, builtin_tokenizer):
    cpu = torch.device("cpu")
    _model, first = quantize_checked(
        copy.deepcopy(tiny_llama), builtin_tokenizer, "int8", cpu, kernels=[BROKEN, GOOD]
    )
    entries = json.loads(qc.cache_path().read_text())
    checks = {e["kernel"]: e["check"] for e in entries.values() if "check" in e}
    assert set(checks) == {"int8-broken-scales", "int8-weight"}
    # A cached failure is not built again (only the one-layer availability probe runs it).
    calls = []

    def counted(weight, bias):
        calls.append(weight.shape)
        return broken_int8(weight, bias)

    counting = dataclasses.replace(BROKEN, make_linear=counted)
    _model, second = quantize_checked(
        copy.deepcopy(tiny_llama), builtin_tokenizer, "int8", cpu, kernels=[counting, GOOD]
    )
    assert len(calls) == 1
    assert second["kernel_check"] == first["kernel_check"]
    assert second["kernels_refused"][0]["check"] == checks["int8-broken-scales"]
    # A new version of the kernel is checked again.
    calls.clear()
    newer = dataclasses.replace(counting, version=2)
    _model, third = quantize_checked(
        copy.deepcopy(tiny_llama), builtin_tokenizer, "int8", cpu, kernels=[newer, GOOD]
    )
    assert len(calls) > 1 and third["kernel"] == "int8-weight"


def test_lm_head_is_untied_and_quantized_and_the_embedding_stays_a_float_gather(builtin_tokenizer):
    model = build_tiny_llama(builtin_tokenizer, seed=1)
    model.lm_head.weight = model.model.embed_tokens.weight
    qk.KERNELS["int8-dynamic-fbgemm"].build(model)
    assert isinstance(model.lm_head, qk.DynamicInt8Linear)
    assert type(model.model.embed_tokens) is torch.nn.Embedding
    assert model.model.embed_tokens.weight.dtype == torch.float32


class FloatLinear(torch.nn.Module):
    """A float layer behind the kernels' interface: F.linear(x * inverse_scale, weight)."""

    def __init__(self, weight, bias, inverse_scale=None):
        super().__init__()
        self.weight, self.bias, self.inverse_scale = weight.clone(), bias, inverse_scale

    def forward(self, x):
        x = x if self.inverse_scale is None else x * self.inverse_scale
        return torch.nn.functional.linear(x, self.weight, self.bias)


def test_smoothing_is_exact_in_float(tiny_llama, builtin_tokenizer):
    """Folding 1/s into the norms and up_proj and s into the weights leaves float logits unchanged."""
    ids = torch.tensor(builtin_tokenizer("Smoothing moves outliers into the weights.")["input_ids"])
    model = copy.deepcopy(tiny_llama)
    maxima, (before,) = input_channel_maxima(model, [ids])
    float_kernel = qk.Kernel("float-smoothed", "int8", "cpu", "float, smoothed", FloatLinear, smooth=True)
    rest = fold_smoothing(copy.deepcopy(model), maxima)
    assert rest and all(".o_proj" in name for name in rest)  # everything else folds away
    float_kernel.build(model, maxima)
    assert not torch.equal(model.model.norm.weight, tiny_llama.model.norm.weight)
    with torch.inference_mode():
        after = model(input_ids=ids.view(1, -1)).logits[0]
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)


def test_dynamic_int8_quantizes_each_token_on_its_own():
    """A row with a large outlier must not flatten the other rows' quantization (per-token scales).

    Judged against the float result and this machine's own quantization error: without VNNI the
    activations keep 7 bits (reduce_range), so the error of a row alone is twice what it is with it."""
    torch.manual_seed(0)
    weight = torch.randn(32, 64) / 8
    layer = qk.KERNELS["int8-dynamic-fbgemm"].make_linear(weight, None)
    x = torch.randn(2, 64)
    x[0, 0] = 500.0
    exact = x[1:] @ weight.T
    alone_error = (layer(x[1:]) - exact).abs().max()
    together_error = (layer(x)[1:] - exact).abs().max()
    assert together_error <= 2 * alone_error + 1e-3
    # the failure this guards against: one scale for the whole call, the outlier's
    shared = torch.ops.quantized.linear_dynamic(x, layer._packed, layer.reduce_range)
    assert (shared[1:] - exact).abs().max() > 10 * together_error


def test_precision_settings():
    assert precision_settings("fp32") == ("float32", "none")
    assert precision_settings("bf16") == ("bfloat16", "none")
    assert precision_settings("int8") == ("auto", "int8")
    with pytest.raises(SettingsError, match="fp32, bf16, int8 or int4"):
        precision_settings("fp8")
    with pytest.raises(SettingsError, match="cannot be combined"):
        precision_settings("bf16", quantization="int8")


# ---- the built-in model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(builtin_model):
    probes = qc.probe_inputs(builtin_model.tokenizer, builtin_model.device)
    maxima, logits = qc.reference_run(builtin_model.model, probes)
    return probes, maxima, logits


def runnable_cpu_kernels():
    return [
        k
        for mode in ("int8", "int4")
        for k in qk.candidates(mode, "cpu")
        if not k.load_time and k.unavailable_reason() is None
    ]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", runnable_cpu_kernels(), ids=lambda k: k.name)
def test_every_kernel_that_runs_here_agrees_with_fp32(builtin_model, reference, kernel):
    probes, maxima, logits = reference
    quantized = kernel.build(copy.deepcopy(builtin_model.model), maxima)
    result = qc.check_against(logits, quantized, probes, kernel.mode)
    assert result.tokens > 150
    assert result.agreement >= qc.MIN_AGREEMENT[kernel.mode], result
    assert result.passed, result


@pytest.mark.slow
def test_stock_dynamic_int8_is_measured_not_assumed(builtin_model, reference):
    """torch.ao's stock path is wrong on some CPUs (AVX-512 VNNI: agreement under 0.5 measured), right
    on others; the check reports it either way, and it is never among the load-time candidates."""
    probes, _maxima, logits = reference
    plain = qk.KERNELS["int8-dynamic-plain"]
    result = qc.check_against(logits, plain.build(copy.deepcopy(builtin_model.model)), probes, "int8")
    assert 0.0 <= result.agreement <= 1.0 and result.max_logit_error > 0
    assert plain not in qk.candidates("int8", "cpu")


# ---- tandem-cli quant-report -----------------------------------------------------------------


def test_quant_report_refuses_an_unknown_kernel(capsys):
    from engine.cli.main import main

    assert main(["quant-report", "--kernels", "int7-magic"]) == 2
    assert "Unknown kernel int7-magic" in capsys.readouterr().err


@pytest.mark.slow
def test_quant_report_measures_a_kernel_against_fp32(tmp_path, capsys):
    from engine.cli.main import main

    path = tmp_path / "report.json"
    argv = ["quant-report", "--kernels", "int8-weight", "--prompts", "1", "--tokens", "4"]
    argv += ["--context", "16", "--steps", "1", "--rounds", "1", "--json", str(path)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "int8-weight" in table and "fp32" in table and "pass" in table
    rows = {row["kernel"]: row for row in json.loads(path.read_text())["rows"]}
    assert rows["fp32"]["c"] == 1.0 and rows["int8-weight"]["c"] > 0
    assert rows["int8-weight"]["memory_bytes"] < rows["fp32"]["memory_bytes"]
    assert 0.0 <= rows["int8-weight"]["prompt_agreement"] <= 1.0
