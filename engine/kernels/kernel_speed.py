"""Ranking quantized kernels by a quick microbenchmark of a model's own linear shapes, per machine."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch
from torch import nn

from engine.kernels.quant_kernels import Kernel
from engine.kernels.quant_smoothing import linear_layers


def linear_shapes(model: nn.Module) -> dict[tuple[int, int], int]:
    """(out_features, in_features) -> how many nn.Linear layers of that shape the model has."""
    shapes: dict[tuple[int, int], int] = {}
    for _name, linear in linear_layers(model):
        shape = tuple(linear.weight.shape)
        shapes[shape] = shapes.get(shape, 0) + 1
    return shapes


@contextlib.contextmanager
def threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _one_layer(kernel: Kernel, n: int, k: int, device) -> nn.Module:
    weight = torch.randn(n, k, device=device) / k**0.5
    if kernel.make_linear is None:
        return kernel.build(nn.Sequential(nn.Linear(k, n, bias=False).to(device)))[0]
    if kernel.smooth:
        return kernel.make_linear(weight, None, torch.ones(k, device=device))
    return kernel.make_linear(weight, None)


@torch.inference_mode()
def layer_ms(kernels: list[Kernel], shapes: dict[tuple[int, int], int], device="cpu", rounds: int = 8):
    """Milliseconds per token of a model's linear layers under each kernel: kernel name -> ms.

    One token (M = 1) through a random-weight layer of each shape, the fastest of `rounds`, times how
    many layers have that shape. Kernels take turns within each round, so load from other processes
    hits them alike. On CPU this runs on one thread: with more threads than free cores, OpenMP's
    barriers make small ops' times meaningless, and the ranking is what is needed.
    """
    import time

    layers = {
        kernel.name: {shape: _one_layer(kernel, *shape, device) for shape in shapes} for kernel in kernels
    }
    inputs = {k: torch.randn(1, 1, k, device=device) for (_n, k) in shapes}
    best = {(name, shape): float("inf") for name in layers for shape in shapes}
    with threads(1) if device == "cpu" else contextlib.nullcontext():
        for _ in range(rounds):
            for name, by_shape in layers.items():
                for shape, layer in by_shape.items():
                    started = time.perf_counter()
                    layer(inputs[shape[1]])
                    if device != "cpu":
                        torch.cuda.synchronize()
                    best[name, shape] = min(best[name, shape], time.perf_counter() - started)
    return {name: sum(1000 * best[name, s] * count for s, count in shapes.items()) for name in layers}


def ranked_by_speed(
    kernels: list[Kernel], model: nn.Module, cache: dict, fingerprint: str
) -> dict[str, float]:
    """Estimated ms per token of each kernel's linear layers here (measured once, then cached).

    Load-time kernels are not microbenchmarked: bitsandbytes stays the CUDA default and the CPU's last resort.
    """
    from engine.kernels import quant_check as qc

    shapes = linear_shapes(model)
    shape_key = hashlib.sha256(repr(sorted(shapes.items())).encode()).hexdigest()[:12]
    speeds: dict[str, float] = {}
    keys: dict[str, str] = {}
    to_measure: list[Kernel] = []
    for kernel in kernels:
        if kernel.load_time:
            speeds[kernel.name] = 0.0 if kernel.device_type == "cuda" else float("inf")
            continue
        keys[kernel.name] = key = qc.machine_key(kernel.name, kernel.version, f"speed:{shape_key}")
        cached = cache.get(key, {}).get("layer_ms")
        if cached is None:
            to_measure.append(kernel)
        else:
            speeds[kernel.name] = cached
    for device_type in {k.device_type for k in to_measure}:
        same = [k for k in to_measure if k.device_type == device_type]
        for name, ms in layer_ms(same, shapes, device_type).items():
            speeds[name] = ms
            qc.write_cache_entry(keys[name], {"kernel": name, "layer_ms": round(ms, 4)})
    return speeds
