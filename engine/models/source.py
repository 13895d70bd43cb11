"""A model spec, parsed once into where the model comes from.

A spec is one of: `builtin:<name>`, a Hugging Face model folder (safetensors only), a `.gguf` file,
or a hub id such as `Qwen/Qwen2.5-0.5B-Instruct`. `parse_source` reads it once: its kind, its local
path, and for a GGUF file a checked header. Loaders and look-ups start from the ModelSource instead
of reading the spec again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

from engine.errors import ModelFormatError, ModelNotFoundError
from engine.models.builtin import BUILTIN_PREFIX, builtin_entry, builtin_gguf_path, is_builtin
from engine.models.gguf_hub import cached_file, is_hub_gguf_spec
from engine.models.hub import looks_like_hub_id

SourceKind = Literal["builtin", "folder", "gguf", "hub"]
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ModelSource:
    spec: str
    kind: SourceKind
    path: Path | None = None  # a folder or a .gguf file; None for a hub id and a built-in model

    @property
    def is_gguf(self) -> bool:
        """A built-in model or a .gguf file: its config, tokenizer and weights are one GGUF file."""
        return self.kind in ("builtin", "gguf")

    @property
    def builtin_name(self) -> str | None:
        return self.spec.removeprefix(BUILTIN_PREFIX) if self.kind == "builtin" else None

    @cached_property
    def gguf_file(self) -> Path:
        """The GGUF file (a built-in model's is the one its package ships); ModelNotFoundError when a
        built-in model's package is missing."""
        if self.kind == "builtin":
            return builtin_gguf_path(builtin_entry(self.spec))
        if self.kind == "gguf":
            return self.path
        raise ModelFormatError(f"'{self.spec}' is not a GGUF model.")


def parse_source(spec: str) -> ModelSource:
    """The spec's source. Raises ModelNotFoundError for a missing path or unknown built-in name, and
    ModelFormatError for a file that is not a GGUF model (a pickle checkpoint is refused by name)."""
    if is_builtin(spec):
        builtin_entry(spec)  # an unknown name fails here, with the known ones listed
        return ModelSource(spec, "builtin")
    path = Path(spec).expanduser()
    if path.is_dir():
        return ModelSource(spec, "folder", path)
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".gguf":
            check_gguf_header(path)
            return ModelSource(spec, "gguf", path)
        if suffix in PICKLE_SUFFIXES:
            raise ModelFormatError(pickle_refusal(path))
        raise ModelFormatError(
            f"'{spec}' is a file but not a GGUF model. Choose a model folder or a .gguf file."
        )
    if is_hub_gguf_spec(spec):  # owner/repo:Q4_K_M: its file once downloaded, else a hub model
        cached = cached_file(spec)
        return ModelSource(spec, "hub") if cached is None else ModelSource(spec, "gguf", cached)
    if looks_like_hub_id(spec):
        return ModelSource(spec, "hub")
    raise ModelNotFoundError(
        f"No model at '{spec}': not a built-in name, an existing folder or .gguf file, "
        "or a hub id like 'Qwen/Qwen2.5-0.5B-Instruct'."
    )


def spec_kind(spec: str) -> SourceKind:
    """'builtin', 'folder', 'gguf' or 'hub' (parse_source's checks and errors)."""
    return parse_source(spec).kind


def check_gguf_header(path: Path) -> None:
    with path.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise ModelFormatError(f"'{path}' is not a GGUF file (its header is wrong).")


def file_key(path: Path) -> str:
    """A short digest of a file's resolved path, size and mtime: the name of what is cached from it."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def pickle_refusal(path: Path) -> str:
    return (
        f"Refusing to load '{path}': it is a pickle checkpoint, and loading a pickle can run arbitrary "
        "code. Use a copy of the model saved as safetensors (most hub models have one)."
    )
