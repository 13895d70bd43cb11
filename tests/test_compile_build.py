"""The CPU compiled path as a user meets it: built in a helper process while replies run eagerly,
switched to between replies, and ready from inductor's cache before "Ready" on the next start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# argv: model folder, "first", "second" or "bench" (built first, as the bench does); prints one JSON line
START_SCRIPT = textwrap.dedent(
    """
    import json, sys, threading, time
    from engine.models.loading import load_model
    from engine.runtime.compile_build import is_built
    from engine.runtime.compile_cache import cache_hits
    from engine.session import ChatEngine
    from engine.settings import SamplingSettings, SpeculationSettings

    folder, start = sys.argv[1], sys.argv[2]
    loaded = load_model(folder, device="cpu", dtype="float32")
    sampling = SamplingSettings(temperature=0.0, max_new_tokens=24)
    engine = ChatEngine(loaded, None, speculation=SpeculationSettings(drafter="ngram"), sampling=sampling)
    begun = time.perf_counter()
    if start == "bench":
        engine.build_compiled()
    engine.prepare()
    prepare_s = time.perf_counter() - begun
    compiled_at_ready = engine.runs_compiled
    prompt = [1, 502, 33, 9001, 77, 4, 1200, 18, 65, 3000]

    def reply():
        finished = engine.generate_ids(prompt)
        engine.reset()
        return list(finished.token_ids)

    replies_while_building, notices_while_building, messages = [], [], []
    done = threading.Event()
    started = engine.optimize_in_background(None, lambda message: (messages.append(message), done.set()))
    notices_while_building = engine.notices
    while started and not done.is_set():
        replies_while_building.append(reply())
        time.sleep(0.5)  # a user reads between replies; the helper builds meanwhile
    print(json.dumps({
        "prepare_s": prepare_s, "compiled_at_ready": compiled_at_ready, "started": started,
        "built": is_built(loaded, ()), "compiled": engine.runs_compiled,
        "replies_while_building": replies_while_building, "reply_after": reply(),
        "messages": messages, "notices_while_building": notices_while_building,
        "notices": engine.notices, **cache_hits(),
        "saved_read": sorted(getattr(engine._runner._compiled, "loaded", {})),
        "saved_built": getattr(engine._runner._compiled, "built", None),
    }))
    """
)


def run_json_script(script: str, *args: str, cache: Path, timeout: int = 900) -> dict:
    """Runs `script` in a fresh interpreter with its own Tandem cache folder (inductor's included)
    and compilation allowed; returns the JSON object on its last line of output."""
    env = {**os.environ, "TANDEM_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TANDEM_COMPILE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_start(folder: Path, cache: Path, which: str) -> dict:
    return run_json_script(START_SCRIPT, str(folder), which, cache=cache)


@pytest.fixture
def row_attention_model_dir(tmp_path, builtin_tokenizer):
    """A tiny model whose heads of 32 attend on Tandem's row kernel: its compiled forwards are saved."""
    from tests.tiny_models import build_tiny_llama

    folder = tmp_path / "tiny-llama-rows"
    build_tiny_llama(builtin_tokenizer, seed=1, hidden=128).save_pretrained(str(folder))
    builtin_tokenizer.save_pretrained(str(folder))
    return folder


@pytest.mark.slow
def test_cpu_compiled_path_is_built_beside_replies_and_ready_at_the_next_start(
    row_attention_model_dir, tmp_path
):
    first = run_start(row_attention_model_dir, tmp_path / "cache", "first")
    assert not first["compiled_at_ready"] and first["started"], first
    assert first["notices_while_building"][0].startswith("Optimizing for this machine"), first
    assert first["built"] and first["compiled"], first
    assert first["messages"][0].startswith("Optimized for this machine"), first
    assert first["notices"] == [], first
    # eager replies while the helper built, compiled ones after: the same tokens
    assert first["replies_while_building"], first
    assert all(reply == first["reply_after"] for reply in first["replies_while_building"]), first
    # the app process read the forwards the helper traced and saved, and traced none itself
    saved = ["one-tokens_layers-none.pt", "several-tokens_layers-none.pt"]
    assert first["saved_read"] == saved and first["saved_built"] == [], first

    second = run_start(row_attention_model_dir, tmp_path / "cache", "second")
    assert second["compiled_at_ready"] and not second["started"], second
    assert second["saved_read"] == saved and second["saved_built"] == [], second
    assert second["miss"] == 0, second  # nothing compiled again
    assert second["reply_after"] == first["reply_after"], second


@pytest.mark.slow
def test_the_bench_builds_the_compiled_path_before_it_measures(row_attention_model_dir, tmp_path):
    """`tandem-cli bench` measures the runner the app switches to: build_compiled waits for the
    helper's build where no earlier start made it, then prepare reads the saved forwards back."""
    bench = run_start(row_attention_model_dir, tmp_path / "cache", "bench")
    assert bench["compiled_at_ready"] and not bench["started"], bench
    assert bench["built"] and bench["notices"] == [], bench
    assert bench["saved_read"] == ["one-tokens_layers-none.pt", "several-tokens_layers-none.pt"], bench
    assert bench["saved_built"] == [], bench  # traced in the helper, not in the measuring process


# argv: model folder; a target with a quantized copy as the draft: its forward built in the background
# (the app) beside a target built already, or first (the bench)
DRAFT_SCRIPT = textwrap.dedent(
    """
    import json, sys, threading
    from engine.models.loading import load_model
    from engine.models.quantize import quantize_model
    from engine.session import ChatEngine
    from engine.settings import SamplingSettings, SpeculationSettings

    loaded = load_model(sys.argv[1], device="cpu", dtype="float32")
    sampling = SamplingSettings(temperature=0.0, max_new_tokens=24)
    prompt = [1, 502, 33, 9001, 77, 4, 1200, 18, 65, 3000]
    alone = ChatEngine(loaded, None, SpeculationSettings(drafter="none"), sampling)
    alone.build_compiled()  # the target's build, as an earlier start would leave it

    def state(engine):
        drafted = engine.generate_ids(prompt)
        return {
            "target": engine.runs_compiled, "draft": engine._model_drafter.runner.is_compiled,
            "drafted": drafted.stats.drafted, "reply": list(drafted.token_ids), "notices": engine.notices,
        }

    app = ChatEngine(loaded, quantize_model(loaded, "int8"), SpeculationSettings(drafter="model", k=3), sampling)
    app.prepare()
    at_ready, done, messages = state(app), threading.Event(), []
    started = app.optimize_in_background(None, lambda message: (messages.append(message), done.set()))
    done.wait(600)
    bench = ChatEngine(loaded, quantize_model(loaded, "int4"), SpeculationSettings(drafter="model", k=3), sampling)
    bench.build_compiled()
    bench.prepare()
    print(json.dumps({
        "alone": list(alone.generate_ids(prompt).token_ids), "at_ready": at_ready, "started": started,
        "messages": messages, "app": state(app), "bench": state(bench),
    }))
    """
)


@pytest.mark.slow
def test_a_quantized_copy_drafts_on_its_own_compiled_forward(row_attention_model_dir, tmp_path):
    """Eager, the INT8 copy of the built-in model took 0.68 of a compiled target step to draft a
    token: the copy's forward is built in the helper as the target's is, then read back."""
    result = run_json_script(DRAFT_SCRIPT, str(row_attention_model_dir), cache=tmp_path / "cache")
    assert result["at_ready"]["target"] and not result["at_ready"]["draft"], result
    assert result["started"] and result["messages"] == ["Optimized for this machine."], result
    for engine in ("app", "bench"):
        assert result[engine]["target"] and result[engine]["draft"], result
        assert result[engine]["drafted"] > 0 and result[engine]["notices"] == [], result
        assert result[engine]["reply"] == result["alone"], result
    assert result["at_ready"]["reply"] == result["alone"], result


def test_a_draft_whose_build_failed_drafts_uncompiled_and_says_so(make_tiny, monkeypatch):
    from engine.models.quantize import quantize_model
    from engine.runtime import compile_build
    from engine.session import ChatEngine

    monkeypatch.delenv("TANDEM_COMPILE")
    loaded = make_tiny(seed=2)
    engine = ChatEngine(loaded, quantize_model(loaded, "int8"))
    failure = "Running without compilation: building the compiled path failed (MemoryError)."
    monkeypatch.setattr(compile_build, "ensure_built", lambda loaded, capture, progress: failure)
    engine.build_compiled()
    engine.prepare()
    assert not engine._model_drafter.runner.is_compiled
    assert (
        "The draft model drafts uncompiled: building the compiled path failed (MemoryError)."
        in engine.notices
    )


def test_nothing_is_built_when_compilation_is_off(make_tiny, monkeypatch):
    from engine.session import ChatEngine

    monkeypatch.setenv("TANDEM_COMPILE", "off")
    engine = ChatEngine(make_tiny(seed=2), None)
    assert not engine.optimize_in_background()
    engine = ChatEngine(make_tiny(seed=2), None, compiled="off")
    monkeypatch.delenv("TANDEM_COMPILE")
    assert not engine.optimize_in_background()
    assert not any("Optimizing" in notice for notice in engine.notices)


def test_a_changed_forward_graph_is_built_again_not_read_from_a_stale_marker(make_tiny, monkeypatch):
    from engine.runtime import compile_build, static_forward

    loaded = make_tiny(seed=2)
    before = compile_build.marker_path(loaded, ())
    monkeypatch.setattr(static_forward, "GRAPH_VERSION", static_forward.GRAPH_VERSION + 1)
    assert compile_build.marker_path(loaded, ()) != before


def test_a_faster_kernel_keeps_the_build_and_measures_the_verify_cost_again(make_tiny, monkeypatch):
    """A kernel's speed version keys the measured verify cost, not the compiled graphs that call it."""
    from engine.runtime import attention, calibration, compile_build, row_linear

    loaded = make_tiny(seed=2)
    # a CPU without AVX2 runs F.linear and SDPA, which have no speed versions (nor another kernel to switch to)
    on_linear_kernel = row_linear.kernel_name(loaded.model) != "F.linear"
    on_kernel = on_linear_kernel or attention.kernel_name(loaded.model) != "sdpa"
    built, measured = compile_build.marker_path(loaded, ()), calibration.calibration_key(loaded, None)
    monkeypatch.setattr(row_linear, "KERNEL_VERSION", row_linear.KERNEL_VERSION + 1)
    monkeypatch.setattr(attention, "ROWS_KERNEL_VERSION", attention.ROWS_KERNEL_VERSION + 1)
    assert compile_build.marker_path(loaded, ()) == built
    assert (calibration.calibration_key(loaded, None) != measured) == on_kernel
    if not on_linear_kernel:
        return
    monkeypatch.setenv("TANDEM_ROW_LINEAR", "off")  # another kernel altogether: another graph
    row_linear.unavailable_reason.cache_clear()
    try:
        assert compile_build.marker_path(loaded, ()) != built
    finally:
        monkeypatch.delenv("TANDEM_ROW_LINEAR")
        row_linear.unavailable_reason.cache_clear()


def test_a_build_from_before_saved_forwards_is_built_again(make_tiny, monkeypatch):
    """A marker left by a build that saved no forwards (or saved them in another format) would have
    the app trace them in its own process before "Ready"; the helper builds them instead."""
    from engine.runtime import compile_build, precompiled

    loaded = make_tiny(seed=2)
    before = compile_build.marker_path(loaded, ())
    assert compile_build.precompiled_folder(loaded, ()).name.startswith(before.stem)
    monkeypatch.setattr(precompiled, "SAVED_FORMAT", precompiled.SAVED_FORMAT + 1)
    assert compile_build.marker_path(loaded, ()) != before


# argv: model folder; starts the helper, prints its pid, then waits to be killed
PARENT_SCRIPT = textwrap.dedent(
    """
    import subprocess, sys, time
    helper = subprocess.Popen([sys.executable, "-m", "engine.runtime.compile_build", "--spec", sys.argv[1]])
    print(helper.pid, flush=True)
    time.sleep(600)
    """
)


def test_the_helper_ends_when_the_app_that_started_it_is_killed(tiny_model_dir, tmp_path):
    import signal
    import time

    env = {**os.environ, "TANDEM_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    env.pop("TANDEM_COMPILE", None)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_SCRIPT, str(tiny_model_dir)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    helper_pid = int(parent.stdout.readline())
    time.sleep(1.5)  # the helper is importing torch or compiling by now
    assert _alive(helper_pid)
    parent.send_signal(signal.SIGKILL)  # no atexit runs in the parent
    parent.wait()
    deadline = time.monotonic() + 20
    while _alive(helper_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(helper_pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # an exited child not yet reaped is a zombie: gone
        return stat.read().split(")")[-1].split()[0] != "Z"
