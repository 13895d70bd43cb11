"""The first build of a target's compiled CPU forward, in a helper process.

Compiling the fast path's forward takes a minute or more on a small CPU the first time; inductor's
on-disk cache (engine.runtime.compile_cache) then gives it back in seconds. The first build runs in a
helper process that loads the same model, so that the app keeps answering eagerly meanwhile: in the
app's own process, tracing holds the interpreter for long stretches, and torch.fx patches
`nn.Module.__call__` process-wide while it traces, which breaks any model forward on another thread.
The helper runs at a lower priority and leaves a marker once the cache holds every graph; the app
then compiles from the cache in seconds, between replies (ChatEngine.optimize_in_background), and
every later start does so before "Ready".

    python -m engine.runtime.compile_build --spec SPEC --dtype float32 [--capture 30]
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from engine.runtime.compile_cache import inductor_cache_dir

PROGRESS_PREFIX = "progress\t"
HELPER_NICENESS = 10
UNCOMPILED = "Running without compilation: "  # how the reasons a build failed begin


def marker_path(loaded, capture: tuple[int, ...]) -> Path:
    """Where the helper records that the cache holds this model's graphs on this machine."""
    return inductor_cache_dir() / "built" / f"{_build_digest(loaded, capture)}.json"


def precompiled_folder(loaded, capture: tuple[int, ...]) -> Path:
    """Where this model's compiled forwards are saved on this machine (engine.runtime.precompiled):
    per torch version too, whose saved code another version need not read."""
    import torch

    return (
        inductor_cache_dir() / "precompiled" / f"{_build_digest(loaded, capture)}-torch-{torch.__version__}"
    )


def _build_digest(loaded, capture: tuple[int, ...]) -> str:
    from engine.runtime import attention, calibration, fused_layer, row_linear
    from engine.runtime.precompiled import SAVED_FORMAT, saving_supported
    from engine.runtime.static_forward import GRAPH_VERSION

    # the model as calibration keys it (architecture, precision, kernels), less the runner's kind, and
    # Tandem's kernels without their speed versions: a faster kernel runs in the same graph
    model = calibration.model_key(loaded, None)
    del model["runner"], model["compiled"]
    model["row_linear"] = row_linear.kernel_name(loaded.model, versioned=False)
    model["attention"] = attention.kernel_name(loaded.model, versioned=False)
    model["layer"] = fused_layer.kernel_name(loaded.model, versioned=False)
    key = {
        "machine": calibration.machine_key(loaded.device),
        **model,
        "capture": list(capture),
        "graph": GRAPH_VERSION,
        # a build from before forwards were saved (or in another format) is built again in the helper,
        # not traced in the app's own process before "Ready"
        "saved_forwards": SAVED_FORMAT if saving_supported() else None,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def is_built(loaded, capture: tuple[int, ...]) -> bool:
    return marker_path(loaded, capture).is_file()


def helper_fits(loaded) -> bool:
    """Whether a second copy of the model fits in the memory available now (with a margin)."""
    from engine.models.memory import available_memory_bytes, model_memory_bytes

    return model_memory_bytes(loaded.model) * 1.5 < available_memory_bytes("cpu")


def build_in_helper(
    loaded, capture: tuple[int, ...], progress: Callable[[str, int, int], None] | None = None
) -> str | None:
    """Runs the helper to completion; None when the cache now holds the graphs, else why not."""
    command = [sys.executable, "-m", "engine.runtime.compile_build", "--spec", loaded.spec]
    command += ["--dtype", str(loaded.dtype).removeprefix("torch.")]
    if loaded.quantization in ("int8", "int4"):
        command += ["--quantization", loaded.quantization, "--kernel", loaded.info["kernel"]]
    elif loaded.quantization == "none":  # a float target, where a GGUF would otherwise run on its blocks
        command += ["--precision", loaded.info.get("precision") or "fp32"]
    command += [arg for layer in capture for arg in ("--capture", str(layer))]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [_repo_root(), os.environ.get("PYTHONPATH")])),
    }
    lower_priority = (lambda: os.nice(HELPER_NICENESS)) if hasattr(os, "nice") else None
    # stderr to a file: a pipe nobody reads until the end could fill and stall the helper
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8") as errors:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, env=env, preexec_fn=lower_priority
        )
        _helpers.add(process)
        for line in process.stdout:
            if line.startswith(PROGRESS_PREFIX) and progress is not None:
                stage, done, total = line[len(PROGRESS_PREFIX) :].rstrip("\n").split("\t")
                progress(stage, int(done), int(total))
        returncode = process.wait()
        _helpers.discard(process)
        errors.seek(0)
        lines = [line for line in errors.read().strip().splitlines() if line.strip()]
    if returncode != 0:
        last = lines[-1:] or ["no output"]
        return f"{UNCOMPILED}building the compiled path failed ({last[0][:300]})."
    return None if is_built(loaded, capture) else f"{UNCOMPILED}the compiled path was not built."


def ensure_built(
    loaded, capture: tuple[int, ...], progress: Callable[[str, int, int], None] | None = None
) -> str | None:
    """Waits for the helper to build what no earlier start built (a minute or two, once per machine);
    None when the cache holds the graphs, else why not."""
    if is_built(loaded, capture):
        return None
    if not helper_fits(loaded):
        return f"{UNCOMPILED}building it would need a second copy of the model in memory."
    return build_in_helper(loaded, capture, progress)


def outcome(failure: str | None, eager_step_s: float | None, compiled_step_s: float | None) -> str:
    """How a background build ended, in words for the user."""
    if failure is not None:
        return failure
    if not eager_step_s or not compiled_step_s:
        return "Optimized for this machine."
    return (
        f"Optimized for this machine: a token now takes {compiled_step_s * 1e3:.0f} ms "
        f"(uncompiled {eager_step_s * 1e3:.0f} ms), measured."
    )


_helpers: set[subprocess.Popen] = set()


@atexit.register
def _stop_helpers() -> None:
    """A helper still building when the app quits stops with it; the next start builds again."""
    for process in list(_helpers):
        process.terminate()


def _exit_with_parent(poll_s: float = 1.0) -> None:
    """Ends the helper when the app that started it is gone (killed, so its atexit never ran)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--kernel", default=None)
    parser.add_argument("--precision", default=None, help="fp32 or bf16 (a GGUF target: its own blocks)")
    parser.add_argument("--capture", type=int, action="append", default=[])
    args = parser.parse_args(argv)
    _exit_with_parent()

    from engine.models.loading import load_model
    from engine.runtime.fastpath import FastRunner

    if args.precision is not None:
        loaded = load_model(args.spec, device="cpu", precision=args.precision)
    else:
        loaded = load_model(
            args.spec, device="cpu", dtype=args.dtype, quantization=args.quantization, kernel=args.kernel
        )
    folder = precompiled_folder(loaded, tuple(args.capture))
    runner = FastRunner(loaded.model, loaded.device, compiled="auto", precompiled_folder=folder)
    runner.compiled_capture = tuple(args.capture)

    def report(stage: str, done: int, total: int) -> None:
        print(f"{PROGRESS_PREFIX}{stage}\t{done}\t{total}", flush=True)

    runner.warm_up(progress=report, trees=True)  # in the cache for engines whose verify cost gives trees room
    if not runner.is_compiled:
        print(runner.notice or "not compiled", file=sys.stderr)
        return 1
    marker = marker_path(loaded, tuple(args.capture))
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"spec": args.spec, "seconds": runner.compile_seconds}), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
