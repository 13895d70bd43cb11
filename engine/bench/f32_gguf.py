"""An F32 copy of a GGUF file, so that llama.cpp can run the very fp32 weights Tandem's target holds.

The built-in model ships as Q4_1; Tandem dequantizes it to fp32. `llama-cpp-f32` compares the two
engines at equal precision on an F32 GGUF written from the same file: every tensor dequantized by the
gguf package, every metadata field copied, the file type set to all-F32. Made once per source file
into Tandem's cache folder.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from engine.paths import cache_dir

ALL_F32 = 0  # general.file_type of a GGUF whose tensors are all F32 (llama_ftype LLAMA_FTYPE_ALL_F32)


def f32_gguf(source: Path) -> Path:
    """The F32 copy of `source` (a .gguf), written on first use."""
    stat = source.stat()
    tag = hashlib.sha256(f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / "gguf" / f"{source.stem}-F32-{tag}.gguf"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        write_f32(source, partial)
        partial.replace(target)
    return target


def write_f32(source: Path, target: Path) -> None:
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(source))
    architecture = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(str(target), architecture)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer adds these itself
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = ALL_F32 if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub_type)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, values, raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
