"""Building and loading Tandem's C++ CPU kernels (engine.kernels.native_ops): built once per machine
in a source install, loaded prebuilt from the installed bundle, which has no compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from engine.kernels import native_ops

ROOT = Path(__file__).resolve().parents[1]

# What the frozen app does: PyInstaller sets sys.frozen and sys._MEIPASS (the bundle's _internal/).
FROZEN = """
import sys
sys.frozen, sys._MEIPASS = True, sys.argv[1]
import torch
from engine.kernels import native_ops
print(native_ops.build_error())
print(hasattr(torch.ops.tandem_layer, "decoder_layer"), hasattr(torch.ops.tandem_block_quant, "linear"))
"""


def run_frozen(bundle, tmp_path) -> list[str]:
    build_here = tmp_path / "build-here"
    env = {**os.environ, "TANDEM_NATIVE_DIR": str(build_here)}
    done = subprocess.run(
        [sys.executable, "-c", FROZEN, str(bundle)], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not build_here.exists() or not any(build_here.rglob("*.so")), "the frozen app built the kernels"
    return done.stdout.strip().splitlines()


def test_the_installed_bundle_loads_the_kernels_packaging_built(tmp_path):
    assert native_ops.build_error() is None, native_ops.build_error()
    bundle = tmp_path / "_internal"
    (bundle / native_ops.BUNDLE_FOLDER).mkdir(parents=True)
    shutil.copy(native_ops.build_folder() / native_ops.library_file_name(), bundle / native_ops.BUNDLE_FOLDER)
    assert run_frozen(bundle, tmp_path) == ["None", "True True"]


def test_a_bundle_without_the_kernels_says_so_and_runs_without_them(tmp_path):
    bundle = tmp_path / "_internal"
    bundle.mkdir()
    said, loaded = run_frozen(bundle, tmp_path)
    assert said.startswith("this installation carries no build of Tandem's CPU kernels"), said
    assert loaded == "False False"


def test_the_build_folder_is_named_after_the_sources_the_toolchain_and_the_flags(monkeypatch, tmp_path):
    sources = tmp_path / "native"
    shutil.copytree(native_ops.SOURCE_FOLDER, sources)
    monkeypatch.setattr(native_ops, "SOURCE_FOLDER", sources)
    monkeypatch.delenv("CXX", raising=False)
    keys = [native_ops.build_key()]
    assert native_ops.build_key() == keys[0]  # the same sources elsewhere: the same build
    header = next(sources.glob("*.h"))
    header.write_text(header.read_text() + "\n// changed\n")  # a header counts as much as a source
    keys.append(native_ops.build_key())
    (sources / "new_kernel.cpp").write_text("// a source added later\n")
    keys.append(native_ops.build_key())
    monkeypatch.setenv("CXX", "clang++")
    keys.append(native_ops.build_key())
    monkeypatch.setattr(native_ops, "CFLAGS", (*native_ops.CFLAGS, "-march=native"))
    keys.append(native_ops.build_key())
    assert len(set(keys)) == len(keys)
    monkeypatch.setenv("TANDEM_NATIVE_DIR", str(tmp_path / "builds"))
    assert native_ops.build_folder().parent == tmp_path / "builds"
    assert native_ops.build_key() in native_ops.build_folder().name


# the sources of the two checkouts: one small op, so the test builds in seconds rather than minutes
STUB_SOURCE = """#include <torch/library.h>
TORCH_LIBRARY(tandem_build_test, m) { m.def("noop(Tensor x) -> Tensor"); }
"""
COUNTING_COMPILER = """#!/bin/sh
case " $* " in *" -shared "*) echo link >> "{log}" ;; esac
exec c++ "$@"
"""
HOLDER = """
import sys, time
from pathlib import Path
from filelock import FileLock
folder = Path(sys.argv[1])
lock = FileLock(str(folder / "build.flock"))  # held while this process lives
lock.acquire()
(folder / "lock").touch()  # torch's own mark of a build in progress, left behind when it is killed
print("held", flush=True)
time.sleep(3600)
"""
STARTER = """
import sys
from engine.kernels import native_ops
assert native_ops.__file__.startswith(sys.argv[1]), native_ops.__file__
progress = (lambda stage, done, total: print(f"progress: {stage} {done}/{total}", flush=True)) if sys.argv[2] == "progress" else None
print("error:", native_ops.build(progress), flush=True)
"""
WAITING = "Waiting for another Tandem to finish building its CPU kernels"  # what a waiting start says
WAIT_S = 600  # only guards against hanging: starting torch on a busy machine takes long


def _said(stream, text: str, lines: list[str]) -> None:
    """Reads `stream` into `lines` until a line holds `text` (or the stream ends)."""
    for line in stream:
        lines.append(line)
        if text in line:
            return


def test_two_checkouts_starting_together_build_the_library_once(tmp_path):
    """Two copies of the sources start while a third process holds the build lock and is then killed:
    both say at once that they wait, one builds, the other loads that build, and the `lock` file that
    torch's builder leaves behind is no obstacle. (The checkouts carry one small source instead of the
    kernels, which take minutes to compile on a busy machine; the build is the same otherwise.)"""
    import threading

    wrapper = tmp_path / "bin" / "counting-c++"
    wrapper.parent.mkdir()
    wrapper.write_text(COUNTING_COMPILER.format(log=tmp_path / "links.log"))
    wrapper.chmod(0o755)
    env = {**os.environ, "TANDEM_NATIVE_DIR": str(tmp_path / "native"), "CXX": str(wrapper)}
    checkouts = []
    for name in ("a", "b"):
        shutil.copytree(
            ROOT / "engine", tmp_path / name / "engine", ignore=shutil.ignore_patterns("__pycache__")
        )
        native = tmp_path / name / "engine" / "kernels" / "native"
        shutil.rmtree(native)
        native.mkdir()
        (native / "stub.cpp").write_text(STUB_SOURCE)
        checkouts.append(tmp_path / name)
    find_folder = "from engine.kernels import native_ops; print(native_ops.build_folder())"
    folder = subprocess.run(
        [sys.executable, "-c", find_folder],
        capture_output=True,
        text=True,
        env=env,
        cwd=checkouts[0],
        timeout=WAIT_S,
        check=True,
    ).stdout.strip()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, folder], stdout=subprocess.PIPE, text=True)
    starters: list[subprocess.Popen] = []
    try:
        assert holder.stdout.readline() == "held\n"
        for checkout, mode in zip(checkouts, ("progress", "stderr"), strict=True):
            starters.append(
                subprocess.Popen(
                    [sys.executable, "-c", STARTER, str(checkout), mode],
                    cwd=checkout,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        # the one with a progress callback says it there; the other on stderr
        lines: list[list[str]] = [[], []]
        streams = (starters[0].stdout, starters[1].stderr)
        readers = [threading.Thread(target=_said, args=(streams[i], WAITING, lines[i])) for i in range(2)]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + WAIT_S
        for reader in readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        assert f"progress: {WAITING} 0/1\n" in lines[0], lines
        assert any(WAITING in line for line in lines[1]), lines
        holder.kill()  # kill -9 of the process that held the lock
        holder.wait(60)
        outputs = [starter.communicate(timeout=WAIT_S) for starter in starters]
    finally:
        for process in (holder, *starters):
            if process.poll() is None:
                process.kill()
                process.wait(60)
    assert [starter.returncode for starter in starters] == [0, 0], outputs
    assert "error: None" in outputs[0][0] and "error: None" in outputs[1][0], outputs
    assert (tmp_path / "links.log").read_text().splitlines() == ["link"], outputs  # one build, by one of them
    assert [p.name for p in (tmp_path / "native").iterdir()] == [Path(folder).name]
    built = [f"progress: {native_ops.BUILDING} 0/1" in outputs[0][0], native_ops.BUILDING in outputs[1][1]]
    assert built.count(True) == 1, outputs


def test_a_build_killed_midway_does_not_stop_the_next_start():
    """torch's builder leaves its `lock` file behind when killed, and no finished build: the next start
    must build (here: find the objects up to date) rather than wait on it."""
    folder = native_ops.build_folder()
    assert native_ops.build_error() is None  # the library is built and loaded here
    (folder / "lock").touch()  # what a build killed midway leaves
    (folder / native_ops.BUILT_FILE).unlink()
    load = "from engine.kernels.native_ops import build_error; print(build_error())"
    done = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr[-2000:]
    assert not (folder / "lock").exists()
    assert (folder / native_ops.BUILT_FILE).read_text() == native_ops.build_key()


def test_the_install_carries_its_own_build_and_an_empty_cache_builds_nothing(tmp_path):
    """`make venv` builds the kernels into the virtual environment (`python -m engine.kernels.native_ops`);
    a start with an empty cache folder then loads that build instead of compiling for minutes."""
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_NATIVE_DIR"}
    installed = Path(sys.prefix) / native_ops.INSTALLED_FOLDER
    done = subprocess.run(
        [sys.executable, "-m", "engine.kernels.native_ops"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0 and "are built" in done.stdout, done.stdout + done.stderr[-2000:]
    assert any(installed.rglob(native_ops.library_file_name()))
    code = "from engine.kernels import native_ops; print(native_ops.build_error()); print(native_ops.installed_build())"
    env["TANDEM_CACHE_DIR"] = str(tmp_path / "empty-cache")
    started = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env
    )
    assert started.returncode == 0, started.stderr[-2000:]
    assert started.stdout.splitlines()[0] == "None"
    assert started.stdout.splitlines()[1].startswith(str(installed))
    assert not (tmp_path / "empty-cache" / "native").exists() or not any(
        (tmp_path / "empty-cache" / "native").rglob("*.so")
    )
    assert "Building" not in started.stderr
