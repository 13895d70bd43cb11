"""Tandem's C++ CPU kernels (engine/kernels/native/*.cpp), built once with torch's extension builder.

One extension holds them all, so a first start compiles once (about 30 s on 2 cores) and every later
start loads the library from the cache folder (per torch version; ninja rebuilds a changed source).
Each source registers its own torch op namespace: `tandem_block_quant` (block-quantized layers,
engine.kernels.block_quant), `tandem_row_linear` (the float linear of decoding and verification,
engine.runtime.row_linear), `tandem_attention` (attention row by row, engine.runtime.attention) and
`tandem_layer` (a whole decoder layer in one call, float or block-quantized, engine.runtime.fused_layer) and
`tandem_gguf` (layers on a GGUF file's own blocks, engine.kernels.gguf_quant). Where
they cannot be built or loaded, each caller says why and takes its float path.

The installed bundle has no compiler: packaging builds the library once and ships it in the bundle's
`tandem_native/` folder (`prebuilt_library()`), which the frozen app loads instead of building. The
kernels choose AVX2 or AVX-512 code at run time, so one build serves every x86-64 CPU.

TANDEM_NATIVE_DIR overrides where the library is built (the test suite shares one across processes).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import torch

LIBRARY = "tandem_native"
BUNDLE_FOLDER = "tandem_native"  # beside the frozen app's modules (sys._MEIPASS)
SOURCES = sorted((Path(__file__).parent / "native").glob("*.cpp"))


def build_folder() -> Path:
    from engine.paths import cache_dir

    root = (
        Path(os.environ["TANDEM_NATIVE_DIR"])
        if os.environ.get("TANDEM_NATIVE_DIR")
        else cache_dir() / "native"
    )
    folder = root / f"torch-{torch.__version__}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@functools.cache
def build_error() -> str | None:
    """None once the kernels are loaded (building them the first time), else why they cannot be."""
    ops = torch.ops
    loaded = (
        (ops.tandem_row_linear, "linear"),
        (ops.tandem_block_quant, "linear"),
        (ops.tandem_attention, "attend"),
        (ops.tandem_layer, "decoder_layer"),
        (ops.tandem_gguf, "linear"),
    )
    if all(hasattr(namespace, name) for namespace, name in loaded):
        return None
    if getattr(sys, "frozen", False):
        return load_prebuilt(prebuilt_library())
    try:
        load_library(build_folder())
    except Exception as exc:  # no compiler, no ninja, a failed build: the kernels are "not here"
        return f"Tandem's CPU kernels could not be built ({first_line(exc)})"
    return None


def load_library(folder: Path) -> None:
    """Builds (if needed) and loads the library, one process at a time.

    torch's builder marks a build with a plain `lock` file; a build killed midway (the app closed on a
    first start) leaves it behind, and every later start would wait for it forever. An OS file lock
    dies with its process, so a `lock` file found while holding it is stale and goes."""
    from filelock import FileLock
    from torch.utils import cpp_extension

    with FileLock(str(folder / "build.flock")):
        (folder / "lock").unlink(missing_ok=True)
        cpp_extension.load(
            name=LIBRARY,
            sources=[str(source) for source in SOURCES],
            extra_cflags=["-O3", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            is_python_module=False,
            verbose=False,
        )


def prebuilt_library() -> Path:
    """Where the frozen app finds the library that packaging built."""
    return Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent)) / BUNDLE_FOLDER / library_file_name()


def library_file_name() -> str:
    """The name torch's extension builder gives the library (its LIB_EXT)."""
    return f"{LIBRARY}.pyd" if sys.platform == "win32" else f"{LIBRARY}.so"


def load_prebuilt(library: Path) -> str | None:
    if not library.is_file():
        return f"this installation carries no build of Tandem's CPU kernels ({library.name} is missing)"
    try:
        torch.ops.load_library(str(library))
    except Exception as exc:  # built for another torch, or a system library missing
        return f"Tandem's bundled CPU kernels could not be loaded ({first_line(exc)})"
    return None


def first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text.splitlines()[0][:160] if text else ''}"


BUILDING = "Building Tandem's CPU kernels for this machine (once)"


def build(progress=None) -> str | None:
    """build_error(), telling `progress` while a first build runs (tens of seconds)."""
    first = (
        build_error.cache_info().currsize == 0
        and not getattr(sys, "frozen", False)
        and not any(build_folder().glob(f"{LIBRARY}*.so"))
    )
    if first and progress is not None:
        progress(BUILDING, 0, 1)
    error = build_error()
    if first and progress is not None:
        progress(BUILDING, 1, 1)
    return error
