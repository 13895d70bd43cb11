"""The verify-cost calibration, kept on disk per machine and model so a second start does not repeat it.

Measuring t(n), the target's forward time over n new tokens, takes seconds on a CPU (tens of
seconds on a busy one). The figures depend on the machine (CPU flags, core count, torch version,
device) and on the model's shape and precision, not on its weights, so that is the key:

    machine: platform, CPU model and flags, torch version and threads, the device (and GPU name)
    model:   sha256 of the architecture config, the activation dtype, the quantization, the runner

One JSON file in the cache dir maps sha256(key) -> {"seconds": {n: s}, "measured_at": epoch}.
Entries older than MAX_AGE_S are measured again. A curve is stored physically sane (a forward over
fewer tokens never costs more than one over more), so one slow measurement on a busy machine does not
stay for a week. Writes are atomic (temp file, then rename); a file
that cannot be read is treated as empty, so a damaged cache only costs one new measurement.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from engine.models.memory import release_freed_memory
from engine.paths import cache_dir
from engine.runtime.threads import ThreadChooser, threads_set_to

FILE_NAME = "calibration.json"
MAX_AGE_S = 7 * 24 * 3600
VERSION = 1  # bump when what is measured changes
# A stored curve is checked at start-up against quick measurements of these sizes: one whose t(2)/t(1)
# or t(4)/t(1) is off by more than STORED_SHAPE_TOLERANCE (twice) is measured again
CHECK_SIZES = (1, 2, 4)
STORED_SHAPE_TOLERANCE = 1.15
SHAPE_JITTER_S = 0.002
# Other programs keeping more than this many cores busy make a start-up measurement no better than the
# stored curve: a shape that disagrees then keeps the stored curve, rescaled (ChatEngine.calibrate).
BUSY_OTHERS_CORES = 0.5
# every verify size adaptive K uses at the default max K (1 + K for K = 0..8), then two larger ones
CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17)
STORED_CURVE_TOLERANCE = 1.5  # a stored curve whose single step is off by more than this is saved rescaled
CHECK_REPEATS = 5
CALIBRATION_TOKENS = 64  # the prompt a curve is measured after


def cache_path() -> Path:
    return cache_dir() / FILE_NAME


@functools.lru_cache(maxsize=1)
def _cpu_description() -> str:
    """CPU model name and feature flags (Linux: /proc/cpuinfo), else what platform tells."""
    model, flags = platform.processor(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            name = name.strip()
            if name == "model name" and not model.strip():
                model = value.strip()
            elif name in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    return f"{model}|{flags}"


def machine_key(device) -> dict:
    """What makes timings on this machine differ from another's."""
    import torch

    key = {
        "platform": f"{platform.system()}-{platform.machine()}",
        "cpu": hashlib.sha256(_cpu_description().encode()).hexdigest()[:16],
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": str(device),
    }
    if getattr(device, "type", None) == "cuda":
        key["gpu"] = torch.cuda.get_device_name(device)
    return key


def model_key(loaded, runner) -> dict:
    """The model as far as its speed goes: architecture, precision, quantization and runner kind
    (`runner` None: the model alone)."""
    from engine.runtime import attention, fused_layer, row_linear

    config = loaded.model.config
    architecture = (
        config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else repr(config)
    )
    return {
        "config": hashlib.sha256(architecture.encode()).hexdigest()[:16],
        "dtype": str(loaded.dtype),
        "quantization": loaded.quantization,
        "kernel": loaded.info.get("kernel"),
        "runner": type(runner).__name__,
        "compiled": runner is not None and runner.is_compiled,
        "row_linear": row_linear.kernel_name(loaded.model),
        "attention": attention.kernel_name(loaded.model),
        "layer": fused_layer.kernel_name(loaded.model),
    }


def calibration_key(loaded, runner) -> str:
    key = {"version": VERSION, "machine": machine_key(loaded.device), "model": model_key(loaded, runner)}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def read_json(path: Path) -> dict:
    """A JSON object from `path`; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load(key: str, path: Path | None = None, now: float | None = None) -> dict[int, float] | None:
    """The stored curve {n: seconds} for key, or None when absent, stale or malformed."""
    entry = read_json(path or cache_path()).get(key)
    now = time.time() if now is None else now
    try:
        if now - float(entry["measured_at"]) > MAX_AGE_S:
            return None
        seconds = {int(n): float(s) for n, s in entry["seconds"].items()}
    except (TypeError, KeyError, ValueError, AttributeError):
        return None
    return seconds if seconds.get(1, 0) > 0 else None


def make_sane(seconds: dict[int, float]) -> dict[int, float]:
    """In place: no forward costs more than one over more tokens. A busy machine can make one
    measurement slow (a single token "slower" than eight); the cheapest larger forward bounds it."""
    cheapest = float("inf")
    for n in sorted(seconds, reverse=True):
        cheapest = min(cheapest, seconds[n])
        seconds[n] = cheapest
    return seconds


def save(key: str, seconds: dict[int, float], path: Path | None = None) -> None:
    """Store one curve, first made sane in place (so the engine runs on the figures it stores);
    other keys in the file are kept. Never raises for a read-only cache."""
    make_sane(seconds)
    path = path or cache_path()
    data = read_json(path)
    data[key] = {"seconds": {str(n): s for n, s in sorted(seconds.items())}, "measured_at": time.time()}
    write_json(path, data)  # on failure the next start measures again


def write_json(path: Path, data: dict) -> None:
    """Writes `data` to `path` atomically (a temporary file, then a rename). A read-only or full
    cache leaves the file as it was, without an error: the caller measures or learns again."""
    temp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=f".{path.stem}-", dir=path.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(data, file, indent=1)
        os.replace(temp, path)
    except OSError:
        if temp is not None:
            Path(temp).unlink(missing_ok=True)


def shape_agrees(stored: dict[int, float], now: dict[int, float]) -> bool:
    """Whether t(n) now, for each checked size n > 1, is what the stored curve's t(n) / t(1) predicts
    from t(1) now: within STORED_SHAPE_TOLERANCE, or within SHAPE_JITTER_S (a small model's forwards
    take a millisecond, and a scheduler's jitter alone bends their ratio)."""
    for check in CHECK_SIZES[1:]:
        if check not in now or check not in stored:
            continue
        expected = stored[check] / stored[1] * now[1]
        shape = now[check] / expected
        within = 1 / STORED_SHAPE_TOLERANCE <= shape <= STORED_SHAPE_TOLERANCE
        if not (within or abs(now[check] - expected) <= SHAPE_JITTER_S):
            return False
    return True


def read_back_or_measure(
    target, runner, threads: ThreadChooser | None = None, progress=None, use_cache: bool = True
) -> dict[int, float]:
    """The verify-cost curve of `target` (a LoadedModel) on `runner`, seconds per forward over n new
    tokens: the stored one where it still fits this machine, else a new measurement, saved; the
    runner's cache is emptied. On a CPU (`threads`) it is measured, and keyed, on the steady thread count
    (ThreadChooser.steady), not on the count the last reply chose from the load: a curve measured after
    a reply ran on one thread was stored under one thread, and the next start, on two, measured the
    machine again. progress("Measuring this machine", 0, 1) is reported only when it measures.

    A curve stored while other programs loaded the machine (or before a CPU change) would make every
    estimate wrong. A quick check of a single step and of one verify size (well under a second)
    rescales it when the machine is faster or slower, and has it measured again when its shape is off:
    t(4) / t(1) is what adaptive K trades on. Where other programs keep the CPU busy
    (BUSY_OTHERS_CORES), a shape that disagrees says more about this moment's load than about the
    curve, and measuring again under that load took a restart 30 s (twice: the uncompiled path, then
    the compiled one) and stored no better a curve; the stored one is kept, rescaled, and every
    round's verify refines it.
    """
    steady = threads.steady if threads is not None else None
    with threads_set_to(steady) if steady else contextlib.nullcontext():
        key = calibration_key(target, runner)
        stored = load(key) if use_cache else None
        if stored is not None:
            now = time_forwards(runner, CHECK_SIZES, CHECK_REPEATS)
            if not shape_agrees(stored, now):
                # a moment of load can bend one quick measurement: only a second one confirms it
                now = time_forwards(runner, CHECK_SIZES, CHECK_REPEATS)
            ratio = now[1] / stored[1]
            if shape_agrees(stored, now) or _busy(threads):
                rescaled = {n: t * ratio for n, t in stored.items()}
                if not 1 / STORED_CURVE_TOLERANCE <= ratio <= STORED_CURVE_TOLERANCE:
                    save(key, rescaled)
                return rescaled
        if progress is not None:
            progress("Measuring this machine", 0, 1)
        seconds = time_forwards(runner, CALIBRATION_SIZES, 3)
        save(key, seconds)
        release_freed_memory()  # the measured forwards' activations and logits
        return seconds


def _busy(threads: ThreadChooser | None) -> bool:
    if threads is None:
        return False
    others = threads.others_busy_now()
    return others is not None and others > BUSY_OTHERS_CORES


def time_forwards(runner, sizes, repeats: int = 3) -> dict[int, float]:
    """Seconds per forward over n new tokens after a short prompt, for n in `sizes` (sizes past the
    runner's context are skipped): the fastest of `repeats` runs after one that warms the shape up,
    since other load on the machine only ever adds time. The runner's cache is emptied."""
    runner.reset()
    # A context shorter than the calibration takes a shorter prompt.
    tokens = max(1, min(CALIBRATION_TOKENS, runner.context_length - max(CALIBRATION_SIZES)))
    runner.prefill([(1000 + i) % runner.vocab_size for i in range(tokens)])
    length, seconds = runner.cache_length, {}
    for n in sizes:
        if length + n > runner.context_length:
            break
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            runner.forward([0] * n)
            runner.synchronize()
            times.append(time.perf_counter() - start)
            runner.rollback(length)
        seconds[n] = min(times[1:])
    runner.reset()
    return seconds
