"""The fast path's row-exact float linear (engine.runtime.row_linear): each code path this CPU runs
against F.linear, every row the same whatever the number of rows, and the fast path using it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.cpu_features import cpu_flags, has_avx2
from engine.runtime import row_linear
from engine.runtime.eager import ModelRunner
from engine.runtime.fastpath import FastRunner

PATHS = (["avx2"] if has_avx2() else []) + (["avx512"] if "avx512f" in cpu_flags() else [])


@pytest.fixture(scope="module", autouse=True)
def available():
    if row_linear.best_path() is None:
        pytest.skip("this CPU has neither AVX2 nor AVX-512")
    assert row_linear.unavailable_reason() is None, row_linear.unavailable_reason()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("k", [576, 200])  # 200: K is no multiple of the vector width
def test_each_code_path_computes_a_linear_layer(path, k):
    torch.manual_seed(k)
    weight, bias = torch.randn(70, k), torch.randn(70)  # 70 rows: the row groups' tail runs too
    most = row_linear.EXACT_ROWS[path]
    for m in sorted({1, 3, 4, 5, 7, 8, 9, 16, 17, most, most + 1}):
        x = torch.randn(m, k)
        for b in (None, bias):
            y = row_linear.linear(x, weight, b, path)
            torch.testing.assert_close(y, F.linear(x, weight, b), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_every_row_is_the_one_row_result_bit_for_bit(path):
    torch.manual_seed(0)
    weight = torch.randn(300, 1536) * 0.02
    x = torch.randn(row_linear.EXACT_ROWS[path], 1536)
    alone = torch.cat([row_linear.linear(x[i : i + 1], weight, None, path) for i in range(len(x))])
    for m in range(2, len(x) + 1):
        assert torch.equal(row_linear.linear(x[:m], weight, None, path), alone[:m]), m
    # the BLAS GEMM gives no such promise (it differs here at several rows on most CPUs); the kernel's
    # rows must still agree with it as numbers
    torch.testing.assert_close(alone, F.linear(x, weight), atol=1e-4, rtol=1e-4)


def test_the_fast_path_runs_its_float_layers_on_the_kernel(make_tiny):
    tiny = make_tiny(seed=7, hidden=128)
    runner = FastRunner(tiny.model, compiled="off")
    fast = runner.fast
    assert fast.fused is not None and all(layer.linear_path == row_linear.best_path() for layer in fast.fused)
    assert fast.head_path == row_linear.best_path()
    prompt = [5, 17, 99, 3, 250, 41, 7, 300, 12]
    reference = ModelRunner(tiny.model)
    torch.testing.assert_close(runner.prefill(prompt), reference.prefill(prompt), atol=1e-4, rtol=1e-4)
    # a verify forward's rows give the one-token steps' logits
    runner.reset()
    runner.prefill(prompt[:5])
    several = runner.forward(prompt[5:])
    runner.reset()
    runner.prefill(prompt[:5])
    one_by_one = torch.cat([runner.forward([token]) for token in prompt[5:]])
    torch.testing.assert_close(several, one_by_one, atol=1e-5, rtol=1e-5)
    assert torch.equal(several.argmax(-1), one_by_one.argmax(-1))


def test_turned_off_the_fast_path_uses_f_linear(monkeypatch, make_tiny):
    monkeypatch.setenv("TANDEM_ROW_LINEAR", "off")
    row_linear.unavailable_reason.cache_clear()
    try:
        assert "TANDEM_ROW_LINEAR" in row_linear.unavailable_reason()
        fast = FastRunner(make_tiny(seed=7, hidden=128).model, compiled="off").fast
        assert all(layer.linear_path is None for layer in fast.fused) and fast.head_path is None
    finally:
        monkeypatch.delenv("TANDEM_ROW_LINEAR")
        row_linear.unavailable_reason.cache_clear()


def test_the_draft_head_runs_on_the_kernel_and_drafts_as_before(builtin_folder):
    from engine.decoding.drafters.head import head_drafter
    from engine.models.builtin import DEFAULT_TARGET
    from engine.models.loading import load_model
    from engine.runtime.row_linear import RowLinear

    target = load_model(DEFAULT_TARGET, device="cpu")
    runner = FastRunner(target.model, compiled="off")
    drafter = head_drafter(target, runner)
    linears = [m for m in drafter.head.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is RowLinear for m in linears)
    x = torch.randn(3, linears[0].in_features)
    torch.testing.assert_close(linears[0](x), F.linear(x, linears[0].weight), atol=1e-4, rtol=1e-5)
