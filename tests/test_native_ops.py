"""Building and loading Tandem's C++ CPU kernels (engine.kernels.native_ops): built once per machine
in a source install, loaded prebuilt from the installed bundle, which has no compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from engine.kernels import native_ops

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


def test_a_first_build_of_the_kernels_is_said_while_it_runs(monkeypatch, tmp_path):
    said = []
    native_ops.build(lambda message, done, total: said.append((message, done)))
    assert said == []  # built already in this process: nothing to say
    monkeypatch.setenv("TANDEM_NATIVE_DIR", str(tmp_path))
    monkeypatch.setattr(native_ops.build_error, "cache_info", lambda: type("Info", (), {"currsize": 0})())
    native_ops.build(lambda message, done, total: said.append((message, done)))
    assert said == [(native_ops.BUILDING, 0), (native_ops.BUILDING, 1)]


def test_a_build_killed_midway_does_not_stop_the_next_start():
    """torch's builder leaves its `lock` file behind when killed; the next start must not wait on it."""
    folder = native_ops.build_folder()
    assert native_ops.build_error() is None  # the library is built and loaded here
    (folder / "lock").touch()  # what a build killed midway leaves
    load = "from engine.kernels.native_ops import build_error; print(build_error())"
    done = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr[-2000:]
    assert not (folder / "lock").exists()
