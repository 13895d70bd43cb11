"""What one GGUF linear costs on this CPU as the number of activation rows grows: t(M)/t(1) of
engine/kernels/native/gguf_quant.cpp for M = 1, 2, 4, 8 on a matrix of a 1-8B model's shape, ns per
weight block row, and the weight bytes a one-row call streams per second beside the machine's copy
bandwidth.

    python -m engine.bench.kernel_curve --types Q4_K,Q5_K,Q6_K --shapes 4096x4096,14336x4096 \
        --baseline main

`--baseline REV` builds gguf_quant.cpp as it is at git revision REV under an op namespace of its own
and times it beside the working tree's kernel, interleaved (old, new, old, new, ...), so both see the
same machine load; each figure is the median over the rounds. The weights are random blocks with sane
fp16 scales (any bytes are valid blocks), so the costs are real and the outputs meaningless.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.kernels import gguf_quant as gq

ROWS = (1, 2, 4, 8)
SOURCE = "engine/kernels/native/gguf_quant.cpp"
# the fp16 fields of each type (byte offset, range of the value written there)
HALF_FIELDS = {
    "Q4_0": [(0, 0.001, 0.02)],
    "Q5_0": [(0, 0.001, 0.02)],
    "Q8_0": [(0, 0.001, 0.02)],
    "Q4_1": [(0, 0.001, 0.02), (2, -0.1, 0.0)],
    "Q5_1": [(0, 0.001, 0.02), (2, -0.1, 0.0)],
    "Q4_K": [(0, 0.0001, 0.002), (2, 0.0001, 0.002)],
    "Q5_K": [(0, 0.0001, 0.002), (2, 0.0001, 0.002)],
    "Q6_K": [(208, 0.0001, 0.002)],
}


def random_blocks(name: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Random bytes in the type's block layout, with sane fp16 scales: [rows, row bytes] uint8."""
    rng = np.random.default_rng(seed)
    values, size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    raw = rng.integers(0, 256, size=(rows, k // values, size), dtype=np.uint8)
    for offset, low, high in HALF_FIELDS[name]:
        halves = rng.uniform(low, high, size=(rows, k // values, 1)).astype(np.float16)
        raw[..., offset : offset + 2] = halves.view(np.uint8)
    return raw.reshape(rows, -1)


def baseline_linear(revision: str):
    """gguf_quant.cpp at `revision`, built as op namespace tandem_gguf_baseline: its linear op."""
    from torch.utils import cpp_extension

    from engine.paths import cache_dir

    source = subprocess.run(
        ["git", "show", f"{revision}:{SOURCE}"], capture_output=True, text=True, check=True
    ).stdout
    source = source.replace("tandem_gguf", "tandem_gguf_baseline").replace(
        "gguf_linear", "gguf_linear_baseline"
    )
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    folder = cache_dir() / "native" / f"baseline-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gguf_quant_baseline.cpp"
    path.write_text(source)
    cpp_extension.load(
        name="tandem_gguf_baseline",
        sources=[str(path)],
        extra_cflags=["-O3", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        is_python_module=False,
    )
    return torch.ops.tandem_gguf_baseline.linear


def copy_bandwidth(megabytes: int = 512, reps: int = 5) -> float:
    """GB/s of a numpy copy (bytes read plus bytes written), the best of `reps`."""
    source = np.ones(megabytes << 20, dtype=np.uint8)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(reps):
        begun = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - begun)
    return 2 * source.nbytes / best / 1e9


def call_time(op, x, weight, type_id, path, calls: int, clock) -> float:
    begun = clock()
    for _ in range(calls):
        op(x, [weight], [type_id], path)
    return (clock() - begun) / calls


def measure(ops: dict, name: str, n: int, k: int, rows, rounds: int, path: str, clock) -> dict:
    type_id = gq.TYPE_IDS[name]
    weight = torch.from_numpy(random_blocks(name, n, k))
    xs = {m: torch.randn(m, k, generator=torch.Generator().manual_seed(m)) for m in rows}
    one = call_time(ops["new"], xs[1], weight, type_id, path, 3, clock)  # warm up, and size the runs
    calls = max(3, int(0.15 / max(one, 1e-6)))
    times = {label: {m: [] for m in rows} for label in ops}
    for _ in range(rounds):
        for m in rows:
            for label, op in ops.items():  # interleaved: old, new, old, new
                times[label][m].append(call_time(op, xs[m], weight, type_id, path, calls, clock))
    blocks = n * k // GGML_QUANT_SIZES[GGMLQuantizationType[name]][0]
    result = {"type": name, "shape": f"{n}x{k}", "weight_bytes": weight.numel()}
    for label in ops:
        median = {m: statistics.median(t) for m, t in times[label].items()}
        result[label] = {
            "ns_per_block_row": median[1] / blocks * 1e9,
            "GB_per_s": weight.numel() / median[1] / 1e9,
            "t1_ms": median[1] * 1e3,
            "ratios": {m: median[m] / median[1] for m in rows if m != 1},
        }
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    parser.add_argument("--shapes", default="4096x4096,14336x4096", help="N x K of each weight")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="git revision of gguf_quant.cpp to time beside this one")
    parser.add_argument("--path", default=None, help="code path (vnni, avx2, portable); the best by default")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the process's CPU time, with --threads 1 the cost on one core even on a busy machine",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    error = gq.build_error()
    if error:
        raise SystemExit(error)
    ops = {}
    if args.baseline:
        ops["old"] = baseline_linear(args.baseline)
    ops["new"] = torch.ops.tandem_gguf.linear
    path = args.path or gq.best_path()
    rows = [int(m) for m in args.rows.split(",")]
    if rows[0] != 1:
        rows = [1, *rows]
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    bandwidth = copy_bandwidth()
    print(
        f"path {path}, {torch.get_num_threads()} threads, {args.clock} clock, "
        f"numpy copy {bandwidth:.1f} GB/s (read + write)"
    )
    results = []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.lower().split("x"))
        for name in args.types.split(","):
            result = measure(ops, name, n, k, rows, args.rounds, path, clock)
            results.append(result)
            for label in ops:
                r = result[label]
                ratios = "  ".join(f"t({m})/t(1) {v:.2f}" for m, v in r["ratios"].items())
                print(
                    f"{name} {n}x{k} {label}: {r['ns_per_block_row']:.1f} ns/block row, "
                    f"{r['t1_ms']:.2f} ms, {r['GB_per_s']:.1f} GB/s at M=1  {ratios}",
                    flush=True,
                )
    if args.json:
        args.json.write_text(
            json.dumps({"copy_GB_per_s": bandwidth, "path": path, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
