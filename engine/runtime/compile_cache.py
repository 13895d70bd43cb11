"""Inductor settings for Tandem's compiled forwards, with its on-disk caches under Tandem's cache folder.

Compiling a model's forward takes tens of seconds on a small CPU. Inductor can keep what it built
(FX graphs, generated C++/Triton kernels, autotuning results) on disk and reuse it on the next
start; pointing those caches at cache_dir()/"inductor" keeps them with Tandem's other files and
lets the user clear them in one place. Call `configure_inductor` before the first compile.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from engine.paths import cache_dir


def inductor_cache_dir() -> Path:
    path = cache_dir() / "inductor"
    path.mkdir(parents=True, exist_ok=True)
    return path


def configure_inductor(device=None, freeze: bool = False) -> Path:
    """Points inductor's caches at Tandem's cache folder and sets the options the fast path uses.

    freeze: fold the weights into the graph as constants. Inductor can then prepack them for its
    own GEMMs, but a graph with prepacked constants cannot be stored in the FX graph cache, so every
    start lowers it again; unfrozen weights stay graph inputs and the graph is read back from disk.
    """
    import torch
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    path = inductor_cache_dir()
    # The environment variable is read when inductor first needs a cache folder; the config
    # attributes cover a process that has compiled before.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ.setdefault("TRITON_CACHE_DIR", str(path / "triton"))
    inductor_config.fx_graph_cache = True
    if hasattr(inductor_config, "autotune_local_cache"):
        inductor_config.autotune_local_cache = True
    if hasattr(inductor_config, "bundled_autotune_remote_cache"):
        inductor_config.bundled_autotune_remote_cache = False

    # A compiled graph's inputs are the forward's own weights and buffers, which never change once
    # built (the token ids and positions keep dynamo's guards). Inductor's code checked the size and
    # stride of each one before every call: 516 checks of about 1 us on the built-in model's 30
    # layers, half a millisecond of each target step and of each 4-bit draft step (about 8 ms).
    inductor_config.size_asserts = False
    # The KV buffers are mutated, so freezing leaves them alone.
    inductor_config.freezing = freeze
    if hasattr(inductor_config, "cpp") and hasattr(inductor_config.cpp, "weight_prepack"):
        inductor_config.cpp.weight_prepack = freeze
    if device is not None and torch.device(device).type == "cuda":
        inductor_config.coordinate_descent_tuning = True

    # Module floats (norm eps) are constants; traced as symbols they make dynamo trace every graph twice.
    if hasattr(dynamo_config, "specialize_float"):
        dynamo_config.specialize_float = True
    # One compiled graph per (tokens, attention window); allow enough of them before dynamo gives up.
    limit_name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    setattr(dynamo_config, limit_name, max(getattr(dynamo_config, limit_name), 64))
    return path


def cache_hits() -> dict[str, int]:
    """Inductor's cache counters for this process.

    hit/miss/bypass: FX graphs (with frozen weights every graph is a bypass: prepacked weights
    cannot be pickled); "autotuned" counts benchmarked GEMMs.
    """
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return {
        "hit": int(inductor["fxgraph_cache_hit"]),
        "miss": int(inductor["fxgraph_cache_miss"]),
        "bypass": int(inductor["fxgraph_cache_bypass"]),
        "autotuned": int(inductor["select_algorithm_autotune"]),
    }


def is_quantized_module(module) -> bool:
    """Whether a module holds quantized weights that the compiled forward does not take."""
    name = type(module).__module__
    if getattr(module, "compilable", True) is False:  # engine.kernels.quant_kernels' packed INT8
        return True
    return "quantized" in name or "bitsandbytes" in name or "torchao" in name


def compiler_missing() -> str | None:
    """Why inductor cannot build CPU kernels here, or None when a C++ compiler is present."""
    compiler = os.environ.get("CXX") or "g++"
    for name in (compiler, "g++", "clang++", "c++"):
        if shutil.which(name):
            return None
    return "no C++ compiler found (install g++ or clang++ to let Tandem optimize models for this CPU)"
