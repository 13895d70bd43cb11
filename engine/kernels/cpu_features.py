"""What this CPU offers (instruction-set flags): kernels are chosen and their checks cached per machine."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def has_avx2() -> bool:
    """AVX2 with FMA: what Tandem's AVX2 kernel paths need."""
    return {"avx2", "fma"} <= cpu_flags()


def has_f16c() -> bool:
    """F16C: float16 loads widened to float32 (the row attention kernel's float16 KV buffers)."""
    return "f16c" in cpu_flags()


def has_vnni() -> bool:
    return bool({"avx512_vnni", "avx_vnni", "avx_vnni_int8"} & cpu_flags())


def cpu_signature() -> str:
    """The CPU features that decide which kernel paths run: capability level and the SIMD flags."""
    wanted = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma", "sse4", "neon", "asimd")))
    return f"{torch.backends.cpu.get_cpu_capability()}:{','.join(wanted)}"
