"""Compiled forwards saved ahead of time and read back at the next start (engine.runtime.precompiled)."""

from __future__ import annotations

import pytest
import torch

from engine.runtime.fastpath import FastRunner
from engine.runtime.precompiled import PrecompiledForward
from tests.test_fastpath import PROMPT, greedy, greedy_verify, replay


@pytest.fixture(autouse=True)
def _own_cache_folder(compilation_allowed, monkeypatch, tmp_path):
    """Compilation on (conftest's compilation_allowed); inductor's caches go to a folder of this test's."""
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path / "cache"))


def test_forwards_saved_at_the_first_start_are_read_back_at_the_next(make_tiny, tmp_path):
    """The first runner traces its forwards and saves them; a second one, as at the next start, reads
    them back without tracing, and both give the logits of the eager forward."""
    loaded = make_tiny(seed=5, hidden=128)  # heads of 32: attention on the row kernel
    folder = tmp_path / "precompiled"
    eager = FastRunner(loaded.model, compiled="off")
    first = FastRunner(loaded.model, compiled="auto", precompiled_folder=folder)
    assert first.fast.row_attention  # the calls that are saved: attention on the row kernel
    first.warm_up()
    assert first.is_compiled, first.notice
    saved = {"one-tokens_layers-none.pt", "several-tokens_layers-none.pt"}
    assert {path.name for path in folder.iterdir()} == saved
    assert set(first._compiled.built) == saved

    second = FastRunner(loaded.model, compiled="off", precompiled_folder=folder)
    assert second.compile_now() and second.is_compiled, second.notice
    assert second._compiled.built == [] and set(second._compiled.loaded) == saved, second._compiled.failure
    for runner in (first, second):
        for expected, actual in zip(replay(eager, PROMPT), replay(runner, PROMPT), strict=True):
            torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)
        assert greedy(runner, PROMPT) == greedy(eager, PROMPT)
        assert greedy_verify(runner, PROMPT, k=3) == greedy(eager, PROMPT)
    for a, b in zip(replay(first, PROMPT), replay(second, PROMPT), strict=True):
        assert torch.equal(a, b)  # the same generated code, read back


def test_a_saved_forward_that_cannot_be_read_is_compiled_as_before(make_tiny, tmp_path):
    loaded = make_tiny(seed=5, hidden=128)  # heads of 32: attention on the row kernel
    folder = tmp_path / "precompiled"
    folder.mkdir()
    (folder / "one-tokens_layers-none.pt").write_bytes(b"not a compiled forward")
    eager = FastRunner(loaded.model, compiled="off")
    runner = FastRunner(loaded.model, compiled="auto", precompiled_folder=folder)
    assert greedy(runner, PROMPT) == greedy(eager, PROMPT)
    assert runner.is_compiled and runner._compiled.failure  # said why, and served by torch.compile
    assert "one-tokens_layers-none.pt" not in runner._compiled.loaded
    assert "several-tokens_layers-none.pt" in runner._compiled.loaded


def test_a_torch_that_cannot_save_compiled_forwards_compiles_as_before(make_tiny, tmp_path, monkeypatch):
    """torch before 2.10 has no aot_compile: the runner keeps its torch.compile forward and saves nothing."""
    from engine.runtime import fastpath

    monkeypatch.setattr(fastpath, "saving_supported", lambda: False)
    loaded = make_tiny(seed=5, hidden=128)
    folder = tmp_path / "precompiled"
    runner = FastRunner(loaded.model, compiled="auto", precompiled_folder=folder)
    assert runner.is_compiled and not isinstance(runner._compiled, PrecompiledForward)
    assert greedy(runner, PROMPT) == greedy(FastRunner(loaded.model, compiled="off"), PROMPT)
    assert not folder.exists()
