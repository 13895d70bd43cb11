"""Shared fixtures: the built-in model, and tiny random Llama models built from a config."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# No background builds of the compiled path from the commands and engines tests start (each would
# run a compiling helper process); the tests of compilation lift this themselves.
os.environ.setdefault("TANDEM_COMPILE", "off")
# Every engine starts from nothing: no test learns which drafter pays from another
# (engine.decoding.drafter_memory); its own tests lift this.
os.environ.setdefault("TANDEM_DRAFTER_MEMORY", "off")
# Tandem's C++ kernels are built once for the whole run, also for the processes tests start with a
# cache folder of their own (engine.kernels.native_ops).
# `make venv` already built them into the environment: the run uses that build.
if "TANDEM_NATIVE_DIR" not in os.environ:
    import sys
    from pathlib import Path

    from engine.kernels.native_ops import INSTALLED_FOLDER
    from engine.paths import cache_dir

    installed = Path(sys.prefix) / INSTALLED_FOLDER
    os.environ["TANDEM_NATIVE_DIR"] = str(installed if installed.is_dir() else cache_dir() / "native")

import pytest  # noqa: E402
import torch  # noqa: E402

# Every reply on torch's own thread count, whatever else the machine runs (engine.runtime.threads):
# runs a test compares stay alike; the chooser's own tests lift this.
os.environ.setdefault("TANDEM_THREADS", str(torch.get_num_threads()))

from engine.models.builtin import DEFAULT_TARGET  # noqa: E402
from tests.tiny_models import build_tiny_llama  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _calibrations_of_this_run(tmp_path_factory):
    """Curves measured by tests (on tiny models, on a machine the suite keeps busy) stay out of the
    user's own calibration file."""
    from engine.runtime import calibration

    path = tmp_path_factory.mktemp("calibration") / calibration.FILE_NAME
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibration, "cache_path", lambda: path)
        yield path


@pytest.fixture(scope="session")
def builtin_folder():
    from engine.models.builtin import ensure_builtin

    return ensure_builtin(DEFAULT_TARGET)


@pytest.fixture(scope="session")
def builtin_tokenizer(builtin_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(builtin_folder))


@pytest.fixture(scope="session")
def builtin_model(builtin_folder):
    """The built-in model at fp32: its GGUF's blocks dequantized (the `--precision fp32` choice)."""
    from engine.models.loading import load_model

    return load_model(DEFAULT_TARGET, device="cpu", precision="fp32")


@pytest.fixture(scope="session")
def native_builtin():
    """The built-in model as it runs by default on a CPU: its GGUF file's own blocks."""
    from engine.models.loading import load_model

    return load_model(DEFAULT_TARGET, device="cpu")


@pytest.fixture(scope="session")
def make_tiny(builtin_tokenizer):
    """make_tiny(seed=0, layers=2) -> LoadedModel on CPU fp32 sharing the built-in tokenizer."""
    import torch

    from engine.models.loaded import LoadedModel

    def make(seed: int = 0, layers: int = 2, hidden: int = 64) -> LoadedModel:
        model = build_tiny_llama(builtin_tokenizer, seed=seed, layers=layers, hidden=hidden)
        return LoadedModel(
            f"tiny-{seed}-{layers}", model, builtin_tokenizer, torch.device("cpu"), torch.float32
        )

    return make


@pytest.fixture
def tiny_model_dir(tmp_path, builtin_tokenizer):
    """A tiny random model saved as a Hugging Face folder (safetensors + tokenizer)."""
    model = build_tiny_llama(builtin_tokenizer, seed=1)
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(str(folder))
    builtin_tokenizer.save_pretrained(str(folder))
    return folder


@pytest.fixture
def store(tmp_path):
    """A conversation database of its own (SQLite, WAL) for one test."""
    from engine.store.database import Store

    with Store(tmp_path / "tandem.db") as opened:
        yield opened


@pytest.fixture(scope="module")
def target(make_tiny):
    """A tiny random Llama (seed 0) shared by one module's tests."""
    return make_tiny(seed=0)


@pytest.fixture(scope="module")
def tiny(make_tiny):
    """A tiny random Llama of two layers (seed 0) shared by one module's tests."""
    return make_tiny(seed=0, layers=2)


@pytest.fixture
def kernel_built():
    """Tandem's row attention and one-call decoder layer run here: a kernel test fails, rather than
    passes on a fallback, where they did not build (a module takes it with usefixtures)."""
    from engine.runtime.attention import rows_unavailable_reason
    from engine.runtime.fused_layer import layer_kernel_unavailable_reason

    for reason in (rows_unavailable_reason(), layer_kernel_unavailable_reason()):
        assert reason is None, reason


@pytest.fixture
def compilation_allowed(monkeypatch):
    """The suite turns compilation off (TANDEM_COMPILE above); the tests of compilation lift it with
    usefixtures."""
    monkeypatch.delenv("TANDEM_COMPILE", raising=False)
