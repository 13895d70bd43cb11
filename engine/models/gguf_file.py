"""A GGUF file's header, read without its tokenizer tables: scalar metadata, tensor names, shapes,
block types and where their bytes lie.

The `gguf` package's reader turns every metadata value into numpy arrays, a 262k-token vocabulary
included, which took tens of seconds and most of a gigabyte for Gemma 3's file. Loading the weights
needs only the tensor table and a few scalars, so arrays are skipped here (their lengths read, their
items not). The format: magic "GGUF", version, tensor count, metadata count; metadata entries (key,
type, value); tensor entries (name, dimensions, type, offset); then the tensor data, aligned to
`general.alignment` (32 by default). Dimensions are listed innermost first (ggml's ne0 = in_features).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFormatError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# metadata value types: size in bytes of the fixed-size ones
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]  # ggml order: innermost dimension first
    block_type: int
    offset: int  # from the start of the file
    size: int  # bytes

    @property
    def rows(self) -> int:
        """Rows of the matrix (the product of every dimension past the first)."""
        count = 1
        for dim in self.shape[1:]:
            count *= dim
        return count


@dataclass
class GGUFHeader:
    path: Path
    version: int
    metadata: dict  # scalar and string values; arrays are recorded by their length only
    array_lengths: dict[str, int]
    tensors: dict[str, TensorEntry]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


class _Cursor:
    def __init__(self, view: memoryview, path: Path):
        self.view, self.at, self.path = view, 0, path

    def take(self, fmt: str):
        try:
            (value,) = struct.unpack_from(fmt, self.view, self.at)
        except struct.error:
            raise ModelFormatError(
                f"'{self.path}' ends inside its GGUF header: the file is cut short."
            ) from None
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.take("<Q")
        if self.at + length > len(self.view):
            raise ModelFormatError(f"'{self.path}' ends inside its GGUF header: the file is cut short.")
        raw = bytes(self.view[self.at : self.at + length])
        self.at += length
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        length = self.take("<Q")
        self.at += length

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        raise ModelFormatError(f"'{self.path}' has a GGUF metadata value of unknown type {kind}.")

    def skip_array(self) -> int:
        kind, count = self.take("<I"), self.take("<Q")
        if kind in _SCALARS:
            self.at += count * struct.calcsize(_SCALARS[kind])
        elif kind == _STRING:
            for _ in range(count):
                self.skip_string()
        elif kind == _ARRAY:
            for _ in range(count):
                self.skip_array()
        else:
            raise ModelFormatError(f"'{self.path}' has a GGUF array of unknown type {kind}.")
        return count


def read_header(path: Path) -> GGUFHeader:
    """The header of the GGUF file at `path`; ModelFormatError if it is not one or is cut short."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    with path.open("rb") as handle:
        if handle.read(4) != MAGIC:
            raise ModelFormatError(f"'{path}' is not a GGUF file (its header is wrong).")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                header = _parse(view, path, GGML_QUANT_SIZES, GGMLQuantizationType)
            finally:
                view.release()
    return header


def _parse(view: memoryview, path: Path, sizes, types) -> GGUFHeader:
    cursor = _Cursor(view, path)
    cursor.at = 4
    version = cursor.take("<I")
    if version not in (2, 3):
        raise ModelFormatError(f"'{path}' is GGUF version {version}; Tandem reads versions 2 and 3.")
    tensor_count, kv_count = cursor.take("<Q"), cursor.take("<Q")
    metadata, arrays = {}, {}
    for _ in range(kv_count):
        key, kind = cursor.string(), cursor.take("<I")
        if kind == _ARRAY:
            arrays[key] = cursor.skip_array()
        else:
            metadata[key] = cursor.value(kind)
    entries = []
    for _ in range(tensor_count):
        name = cursor.string()
        dims = tuple(cursor.take("<Q") for _ in range(cursor.take("<I")))
        block_type, offset = cursor.take("<I"), cursor.take("<Q")
        entries.append((name, dims, block_type, offset))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = (cursor.at + alignment - 1) // alignment * alignment
    tensors = {}
    for name, dims, block_type, offset in entries:
        try:
            values, block_bytes = sizes[types(block_type)]
        except (ValueError, KeyError):
            raise ModelFormatError(
                f"'{path}': tensor {name} has an unknown block type {block_type}."
            ) from None
        count = 1
        for dim in dims:
            count *= dim
        size = count // values * block_bytes
        start = data_start + offset
        if start + size > len(view):
            raise ModelFormatError(
                f"'{path}' is truncated: tensor {name} ends past the file's end. The download or copy was "
                "interrupted; fetch it again."
            )
        tensors[name] = TensorEntry(name, dims, block_type, start, size)
    return GGUFHeader(path, version, metadata, arrays, tensors)
