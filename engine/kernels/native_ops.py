"""Tandem's C++ CPU kernels (engine/kernels/native/*.cpp), built once with torch's extension builder.

One extension holds them all, so a first start compiles once (about 30 s on 2 cores) and every later
start loads the library from the cache folder. Each source registers its own torch op namespace:
`tandem_block_quant` (block-quantized layers, engine.kernels.block_quant), `tandem_row_linear` (the
float linear of decoding and verification, engine.runtime.row_linear), `tandem_attention` (attention
row by row, engine.runtime.attention), `tandem_layer` (a whole decoder layer in one call, float or
block-quantized, engine.runtime.fused_layer) and `tandem_gguf` (layers on a GGUF file's own blocks,
engine.kernels.gguf_quant). Where they cannot be built or loaded, each caller says why and takes its
float path.

The cache folder is named after what the library is made of: a hash of every file in native/, the
torch version, the compiler and its flags (`build_key`). Two installs or checkouts of the same sources
share one build; changed sources get a folder of their own, so two versions never rebuild each
other's. One process builds at a time (an OS file lock, which dies with its holder, so a killed
build's lock is taken over); one that finds another building says so at once and waits for it.

The installed bundle has no compiler: packaging builds the library once and ships it in the bundle's
`tandem_native/` folder (`prebuilt_library()`), which the frozen app loads instead of building. The
kernels choose AVX2 or AVX-512 code at run time, so one build serves every x86-64 CPU.

TANDEM_NATIVE_DIR overrides where the library is built (the test suite shares one across processes).
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path

import torch

LIBRARY = "tandem_native"
BUNDLE_FOLDER = "tandem_native"  # beside the frozen app's modules (sys._MEIPASS)
SOURCE_FOLDER = Path(__file__).parent / "native"
CFLAGS = ("-O3", "-fopenmp")
LDFLAGS = ("-fopenmp",)
LOCK_FILE = "build.flock"
BUILT_FILE = "built"  # written after a build that loaded; holds its build_key
BUILDING = "Building Tandem's CPU kernels for this machine (once)"
WAITING = "Waiting for another Tandem to finish building its CPU kernels"

_outcome: list[str | None] = []  # build()'s answer, once known in this process
_outcome_lock = threading.Lock()


def source_files() -> list[Path]:
    """Every file the library is made of (sources and headers alike)."""
    return sorted(p for p in SOURCE_FOLDER.iterdir() if p.is_file() and not p.name.startswith("."))


def build_key() -> str:
    """What the library is made of, hashed: the sources' names and bytes, torch, the compiler, the flags."""
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())
    toolchain = (torch.__version__, os.environ.get("CXX", "c++"), CFLAGS, LDFLAGS)
    digest.update(repr(toolchain).encode())
    return digest.hexdigest()[:16]


INSTALLED_FOLDER = "tandem-native"  # beside the virtual environment's packages (sys.prefix)


def installed_build() -> Path | None:
    """The library the install itself carries for these very sources, if any: `make venv` builds it
    into the virtual environment, so a start with an empty cache folder loads it instead of building."""
    if os.environ.get("TANDEM_NATIVE_DIR"):
        return None
    folder = Path(sys.prefix) / INSTALLED_FOLDER / f"torch-{torch.__version__}-{build_key()}"
    return folder / library_file_name() if _finished(folder) else None


def build_folder() -> Path:
    from engine.paths import cache_dir

    root = (
        Path(os.environ["TANDEM_NATIVE_DIR"])
        if os.environ.get("TANDEM_NATIVE_DIR")
        else cache_dir() / "native"
    )
    folder = root / f"torch-{torch.__version__}-{build_key()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def build(progress=None) -> str | None:
    """None once the kernels are loaded (building them the first time), else why they cannot be.

    A first build (tens of seconds), and a wait on another process's build, are said through
    `progress(stage, done, total)`; without it, on stderr."""
    with _outcome_lock:
        if not _outcome:
            _outcome.append(_load(progress))
        return _outcome[0]


def build_error() -> str | None:
    """build() for callers that have no progress to show: the answer is cached after the first call."""
    return build()


def _load(progress) -> str | None:
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
    installed = installed_build()
    if installed is not None:  # the install's own build of these sources: nothing to build or wait for
        return load_prebuilt(installed)
    try:
        load_library(build_folder(), progress)
    except Exception as exc:  # no compiler, no ninja, a failed build: the kernels are "not here"
        return f"Tandem's CPU kernels could not be built ({first_line(exc)})"
    return None


def load_library(folder: Path, progress=None) -> None:
    """Builds the library in `folder` unless a finished build of these sources is there, and loads it.

    One process builds at a time, under an OS file lock that dies with its holder. A process that
    finds the lock taken says so at once (WAITING) and waits; it then loads what the other built, or
    builds itself if the other was killed. torch's builder marks a build with a plain `lock` file of
    its own, which a killed build leaves behind and every later start would wait on forever: one found
    while holding the OS lock is stale and goes."""
    from filelock import FileLock, Timeout

    if not _finished(folder):
        lock = FileLock(str(folder / LOCK_FILE))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            _say(progress, WAITING, 0)
            lock.acquire()
            _say(progress, WAITING, 1)
        try:
            if not _finished(folder):
                _build_locked(folder, progress)
                return
        finally:
            lock.release()
    torch.ops.load_library(str(folder / library_file_name()))


def _build_locked(folder: Path, progress) -> None:
    from torch.utils import cpp_extension

    (folder / "lock").unlink(missing_ok=True)
    (folder / BUILT_FILE).unlink(missing_ok=True)
    _say(progress, BUILDING, 0)
    cpp_extension.load(
        name=LIBRARY,
        sources=[str(source) for source in source_files() if source.suffix == ".cpp"],
        extra_cflags=list(CFLAGS),  # copies: torch's builder appends to the lists it is given
        extra_ldflags=list(LDFLAGS),
        build_directory=str(folder),
        is_python_module=False,
        verbose=False,
    )
    (folder / BUILT_FILE).write_text(build_key())
    _say(progress, BUILDING, 1)


def _finished(folder: Path) -> bool:
    """Whether a build of these very sources completed in `folder` (a killed one leaves no mark)."""
    try:
        return (folder / BUILT_FILE).read_text() == build_key() and (folder / library_file_name()).is_file()
    except OSError:
        return False


def _say(progress, stage: str, done: int) -> None:
    if progress is not None:
        progress(stage, done, 1)
    elif done == 0:
        print(f"{stage}…", file=sys.stderr, flush=True)


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


if __name__ == "__main__":  # `make venv`: the install's own build (installed_build), made once
    os.environ["TANDEM_NATIVE_DIR"] = str(Path(sys.prefix) / INSTALLED_FOLDER)
    problem = build()
    print(problem or f"Tandem's CPU kernels are built ({build_folder()}).")
