"""A GGUF file loaded as it is: its quantized tensors computed on directly, never turned into floats.

The file is memory-mapped (private, copy-on-write), and every quantized matrix becomes a
GGUFLinear (or, for the token embedding, a GGUFEmbedding) over its bytes in the mapping
(engine.kernels.gguf_quant): nothing is copied, and the process holds the file's pages as the
kernels read them, about the file's size. Small float tensors (norms, biases) are read as floats.
The exceptions are Llama-family query and key matrices, whose rows the converter to GGUF permuted
for llama.cpp's RoPE; their rows are put back in transformers' order, a copy of about a tenth of
the weights.

The model itself is transformers' own class for the file's architecture, built without weights
(accelerate's init_empty_weights) from the config the file describes, so the static fast path
(engine.runtime.fastpath) and the eager runner take it as they take any model.

Config, tokenizer and chat template come from the file's metadata. transformers' GGUF reader turns
every vocabulary entry into Python objects (for Gemma 3's 262k tokens, tens of seconds and most of a
gigabyte), so that conversion runs once, in a helper process, and its result (config.json and the
tokenizer's files, a few megabytes) is kept in the cache folder: later starts read it in a second.
The tokenizer is read from that tokenizer.json by the `tokenizers` library alone (load_tokenizer_once),
so the process holds its vocabulary once, in Rust, and no copy of it in Python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from engine.errors import ModelFormatError
from engine.models.gguf_file import GGUFHeader, TensorEntry, read_header
from engine.models.source import file_key
from engine.paths import models_cache_dir

METADATA_MARKER = "tandem-gguf-metadata.json"
# the converter permuted these matrices' rows for llama.cpp's RoPE (transformers' LlamaTensorProcessor)
PERMUTED_ROWS = (".attn_q.", ".attn_k.")
FLOAT_TYPES = (0, 1, 30)  # F32, F16, BF16


def metadata_folder(gguf_path: Path, name: str | None = None) -> Path:
    """Where a GGUF file's config and tokenizer are kept, keyed by its path, size and mtime."""
    return models_cache_dir() / "gguf-native" / (name or f"{gguf_path.stem}-{file_key(gguf_path)}")


def ensure_metadata(gguf_path: Path, folder: Path, progress=None) -> Path:
    """The folder with the file's config.json and tokenizer, written once (in a helper process)."""
    marker = folder / METADATA_MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text()).get("source_size") == gguf_path.stat().st_size:
                return folder
        except (OSError, ValueError):
            pass
    stage = "Reading the model's tokenizer and settings from its GGUF file (once)"
    if progress is not None:
        progress(stage, 0, 1)
    folder.parent.mkdir(parents=True, exist_ok=True)
    if getattr(sys, "frozen", False):  # the installed bundle has no interpreter to run a helper with
        write_metadata(gguf_path, folder)
    else:
        done = subprocess.run(
            [sys.executable, "-m", "engine.models.gguf_native", str(gguf_path), str(folder)],
            capture_output=True,
            text=True,
            env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"},
        )
        if done.returncode != 0:
            lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
            reason = lines[-1] if lines else f"exit code {done.returncode}"
            raise ModelFormatError(f"Could not read the GGUF file {gguf_path}: {reason}")
    if progress is not None:
        progress(stage, 1, 1)
    return folder


def write_metadata(gguf_path: Path, folder: Path) -> None:
    """transformers' reading of the file's metadata, saved as a config and tokenizer folder."""
    import shutil

    from transformers import AutoConfig, AutoTokenizer

    header = read_header(gguf_path)
    try:
        config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except (OSError, ValueError, KeyError, NotImplementedError) as exc:
        raise ModelFormatError(f"Could not read the GGUF file {gguf_path}: {exc}") from exc
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    config.save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    marker = {
        "source": str(gguf_path),
        "source_size": gguf_path.stat().st_size,
        "architecture": header.architecture,
    }
    (partial / METADATA_MARKER).write_text(json.dumps(marker, indent=2))
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)


def file_type_name(header: GGUFHeader) -> str:
    """The file's quantization as llama.cpp names it (Q4_K_M, Q8_0, ...), or its commonest block type."""
    from gguf.constants import GGMLQuantizationType, LlamaFileType

    value = header.metadata.get("general.file_type")
    try:
        return LlamaFileType(int(value)).name.removeprefix("MOSTLY_").replace("ALL_", "")
    except (TypeError, ValueError):
        types = Counter(
            entry.block_type for entry in header.tensors.values() if entry.block_type not in FLOAT_TYPES
        )
        return GGMLQuantizationType(types.most_common(1)[0][0]).name if types else "F32"


def load_native(gguf_path: Path, folder: Path, progress=None):
    """(model, tokenizer, info) for the GGUF file at `gguf_path`, on the CPU, on its own blocks."""
    import numpy as np
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.kernels import gguf_quant
    from engine.models.hf import from_pretrained
    from engine.models.memory import release_freed_memory

    error = gguf_quant.build_error()
    if error is not None:
        raise ModelFormatError(f"Tandem's CPU kernels are needed to run a GGUF file as it is: {error}")
    header = read_header(gguf_path)
    ensure_metadata(gguf_path, folder, progress)
    config = from_pretrained(AutoConfig, folder)
    tokenizer = load_tokenizer_once(folder)
    release_freed_memory()  # the tokenizer file's parse
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    processor, name_map = _tensor_names(model, header, config)
    mapped = np.memmap(gguf_path, mode="c")
    placed, unused = _place_tensors(model, header, mapped, processor, name_map, config)
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ModelFormatError(
            f"'{gguf_path}' holds no tensor for {', '.join(missing[:3])}: Tandem cannot run this "
            f"{header.architecture} file as it is. Choose precision fp32 to load it converted."
        )
    model.eval()
    info = {
        "precision": file_type_name(header),
        "kernel": f"gguf-native-{gguf_quant.best_path()}",
        "block_types": dict(Counter(gguf_quant.TYPE_NAMES.get(e.block_type, "float") for e in placed)),
        "file_bytes": gguf_path.stat().st_size,
        "unused_tensors": unused,
        "source": "gguf",
    }
    return model, tokenizer, info


# tokenizer_config.json keys that are not arguments of a tokenizer class's __init__
_NOT_INIT_ARGUMENTS = ("tokenizer_class", "auto_map", "added_tokens_decoder", "chat_template")
# a tokenization model's options besides its vocabulary (BPE, Unigram, WordPiece, WordLevel)
_MODEL_OPTIONS = (
    "dropout",
    "unk_token",
    "unk_id",
    "continuing_subword_prefix",
    "end_of_word_suffix",
    "fuse_unk",
    "byte_fallback",
    "ignore_merges",
    "max_input_chars_per_word",
)


def load_tokenizer_once(folder: Path):
    """The metadata folder's tokenizer, its vocabulary held once: in the Rust tokenizer, read from
    tokenizer.json by the `tokenizers` library itself.

    transformers builds a tokenizer whose class has its own __init__ (GemmaTokenizer, Qwen2Tokenizer)
    another way: it reads tokenizer.json into Python objects twice (for its added tokens, then for the
    vocabulary and merges), builds the Rust tokenizer from those, and keeps the vocabulary and merges
    on the tokenizer (`_vocab`, `_merges`). For Gemma 3 (262k tokens, 515k merges) the process held
    330 MB more for its tokenizer, and peaked 470 MB above its start while reading it; read by Rust
    alone it holds 100 MB (after release_freed_memory), peaking at 360 MB. A class without its own
    __init__ has the file read by Rust, and so does a subclass of any class that defines none, which
    is what this loads; the object is then given the class itself back.

    That road is taken only where it builds the same tokenizer: the class's __init__ sets the
    normalizer, pre-tokenizer, decoder and model options itself, and the file's must be the same ones
    (they are, where the file was saved from that class). Otherwise, or for a class that is not a
    `tokenizers`-backed one, transformers' own loading runs."""
    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    from engine.models.hf import from_pretrained

    config = json.loads((folder / "tokenizer_config.json").read_text())
    name = config.get("tokenizer_class")
    cls = tokenizer_class_from_name(name) if isinstance(name, str) else None
    if (
        not isinstance(cls, type)
        or not issubclass(cls, TokenizersBackend)
        or "auto_map" in config
        or not (folder / "tokenizer.json").is_file()
    ):
        return from_pretrained(AutoTokenizer, folder)
    reads_file = type(cls.__name__, (cls,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    # Without added_tokens_decoder in its config, transformers reads the whole tokenizer.json into
    # Python for the added tokens alone; the Rust tokenizer reads them from the file anyway.
    legacy_files = ("special_tokens_map.json", "added_tokens.json")
    if "added_tokens_decoder" in config or any((folder / f).is_file() for f in legacy_files):
        tokenizer = from_pretrained(reads_file, folder)
    else:
        tokenizer = from_pretrained(reads_file, folder, added_tokens_decoder={})
    tokenizer.__class__ = cls
    if "__init__" in cls.__dict__ and not _same_pipeline(cls, config, tokenizer.backend_tokenizer):
        del tokenizer
        return from_pretrained(AutoTokenizer, folder)
    return tokenizer


def _same_pipeline(cls, config: dict, backend) -> bool:
    """Whether `cls`'s own __init__ builds the normalizer, pre-tokenizer, decoder and model options
    that `backend` (read from the file) holds: it is built here over no vocabulary, which is cheap."""
    arguments = {key: value for key, value in config.items() if key not in _NOT_INIT_ARGUMENTS}
    try:
        built = cls(**arguments).backend_tokenizer
    except Exception:  # a class that needs its files to be built at all: transformers' loading decides
        return False

    def parts(tokenizer):
        return (
            [
                None if c is None else json.loads(c.__getstate__())
                for c in (tokenizer.normalizer, tokenizer.pre_tokenizer, tokenizer.decoder)
            ],
            type(tokenizer.model).__name__,
            {option: getattr(tokenizer.model, option, None) for option in _MODEL_OPTIONS},
        )

    return parts(built) == parts(backend)


def _tensor_names(model, header: GGUFHeader, config):
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=config.to_dict())
    try:
        name_map = get_gguf_hf_weights_map(model, processor)
    except NotImplementedError as exc:
        raise ModelFormatError(f"'{header.path}': {exc}") from exc
    return processor, name_map


def _blocks(entry: TensorEntry, mapped, reorder=None):
    """The tensor's bytes as a [rows, row bytes] uint8 tensor: a view of the mapping, or, with
    `reorder` (row indices), a copy read with pread so the mapping's pages are never touched."""
    import numpy as np
    import torch

    row_bytes = entry.size // entry.rows
    if reorder is None:
        return torch.from_numpy(
            mapped[entry.offset : entry.offset + entry.size].reshape(entry.rows, row_bytes)
        )
    with open(mapped.filename, "rb") as handle:
        raw = np.frombuffer(os.pread(handle.fileno(), entry.size, entry.offset), dtype=np.uint8)
    return torch.from_numpy(np.ascontiguousarray(raw.reshape(entry.rows, row_bytes)[reorder]))


def _floats(entry: TensorEntry, mapped):
    import numpy as np
    from gguf.quants import dequantize

    raw = mapped[entry.offset : entry.offset + entry.size]
    return np.asarray(dequantize(raw, entry.block_type), dtype=np.float32).reshape(
        tuple(reversed(entry.shape))
    )


def _row_order(entry: TensorEntry, config):
    """Llama-family q/k rows back in transformers' order (the inverse of llama.cpp's permute)."""
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    heads = config.num_attention_heads if ".attn_q." in entry.name else config.num_key_value_heads
    rows = np.arange(entry.rows)[:, None]
    return LlamaTensorProcessor()._reverse_permute_weights(rows, heads, heads)[:, 0]


def _place_tensors(model, header: GGUFHeader, mapped, processor, name_map: dict, config):
    """Puts every tensor of the file into `model`: quantized matrices as GGUF modules over the
    mapping, the rest as float parameters. Returns (the entries placed, names of tensors unused)."""
    import torch
    from torch import nn
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    from engine.kernels.gguf_quant import TYPE_NAMES, GGUFEmbedding, GGUFLinear

    permutes = isinstance(processor, LlamaTensorProcessor)
    placed, unused, floats = [], [], []
    for entry in header.tensors.values():
        target = name_map.get(entry.name)
        if target is None:
            unused.append(entry.name)
            continue
        if entry.block_type in FLOAT_TYPES:
            floats.append((entry, target))
            continue
        if entry.block_type not in TYPE_NAMES:
            raise ModelFormatError(
                f"'{header.path}': tensor {entry.name} is stored as block type {entry.block_type}, which "
                "Tandem's kernels do not compute on (they take Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and "
                "Q6_K). Choose precision fp32 to load it converted."
            )
        owner, attribute = target.rsplit(".", 1)
        module = model.get_submodule(owner)
        reorder = (
            _row_order(entry, config) if permutes and any(p in entry.name for p in PERMUTED_ROWS) else None
        )
        blocks = _blocks(entry, mapped, reorder)
        if attribute != "weight" or len(entry.shape) != 2:
            raise ModelFormatError(f"'{header.path}': tensor {entry.name} is quantized but is not a matrix.")
        if isinstance(module, nn.Embedding):
            scale = getattr(module, "embed_scale", None)
            scale = None if scale is None else float(scale)
            replacement = GGUFEmbedding(blocks, entry.block_type, entry.shape[0], scale)
        elif isinstance(module, nn.Linear):
            replacement = GGUFLinear(blocks, entry.block_type, entry.shape[0])
        else:
            raise ModelFormatError(f"'{header.path}': tensor {entry.name} feeds a {type(module).__name__}.")
        _replace(model, owner, replacement)
        placed.append(entry)
    for entry, target in floats:
        weights = processor.process(weights=_floats(entry, mapped), name=entry.name).weights
        owner, attribute = target.rsplit(".", 1)
        module = model.get_submodule(owner)
        value = torch.from_numpy(weights.copy())
        if isinstance(module, GGUFLinear) and attribute == "bias":
            module.bias = value.float()
        else:
            setattr(module, attribute, nn.Parameter(value, requires_grad=False))
        placed.append(entry)
    _tie_head(model, config)
    return placed, unused


def _replace(model, name: str, module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _tie_head(model, config) -> None:
    """A model without its own output matrix reads its embedding's (the LM head tied to it)."""
    from torch import nn

    from engine.kernels.gguf_quant import GGUFEmbedding, GGUFLinear

    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if type(head) is not nn.Linear or not head.weight.is_meta:
        return
    if isinstance(embedding, GGUFEmbedding):
        tied = GGUFLinear(embedding.blocks, embedding.block_type, embedding.embedding_dim)
        _replace(model, _module_name(model, head), tied)
    elif getattr(config, "tie_word_embeddings", False):
        head.weight = embedding.weight


def _module_name(model, target) -> str:
    return next(name for name, module in model.named_modules() if module is target)


if __name__ == "__main__":  # the helper process of ensure_metadata
    try:
        write_metadata(Path(sys.argv[1]), Path(sys.argv[2]))
    except ModelFormatError as error:
        print(error, file=sys.stderr)
        sys.exit(2)
