"""Load a target or draft model with its tokenizer from a model spec.

A spec is one of: `builtin:<name>`, a Hugging Face model folder (safetensors only), a `.gguf`
file, a hub id such as `Qwen/Qwen2.5-0.5B-Instruct`, or a hub GGUF file: `owner/repo:Q4_K_M` or
`owner/repo/file.gguf` (engine.models.gguf_hub; downloaded once, then a `.gguf` file like any other).
Code shipped with a model is never run.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from engine.errors import ModelFormatError, ModelNotFoundError
from engine.models.builtin import (
    BUILTIN_PREFIX,
    ProgressCallback,
    builtin_entry,
    builtin_gguf_path,
    convert_gguf_to_folder,
    ensure_builtin,
    is_builtin,
    is_converted,
)
from engine.models.gguf_hub import resolve_spec as resolve_hub_gguf
from engine.models.hf import from_pretrained
from engine.models.hub import download_model, looks_like_hub_id
from engine.models.loaded import LoadedModel, resolve_device, resolve_dtype
from engine.paths import models_cache_dir

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# the files a tokenizer is read from: fast, SentencePiece, BPE, WordPiece; *.tiktoken besides
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")  # fmt: skip


# ---- sources ---------------------------------------------------------------------------------


def spec_kind(spec: str) -> str:
    """'builtin', 'folder', 'gguf' or 'hub'. Raises ModelNotFoundError for a missing path."""
    if is_builtin(spec):
        return "builtin"
    path = Path(spec).expanduser()
    if path.is_dir():
        return "folder"
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return "gguf"
        if path.suffix.lower() in PICKLE_SUFFIXES:
            raise ModelFormatError(_pickle_refusal(path))
        raise ModelFormatError(
            f"'{spec}' is a file but not a GGUF model. Choose a model folder or a .gguf file."
        )
    if looks_like_hub_id(spec):
        return "hub"
    raise ModelNotFoundError(
        f"No model at '{spec}': not a built-in name, an existing folder or .gguf file, "
        "or a hub id like 'Qwen/Qwen2.5-0.5B-Instruct'."
    )


def _pickle_refusal(path: Path) -> str:
    return (
        f"Refusing to load '{path}': it is a pickle checkpoint, and loading a pickle can run arbitrary "
        "code. Use a copy of the model saved as safetensors (most hub models have one)."
    )


def gguf_cache_folder(gguf_path: Path) -> Path:
    """Where a GGUF file's converted safetensors copy lives, keyed by its path, size and mtime."""
    stat = gguf_path.stat()
    key = f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return models_cache_dir() / "gguf" / f"{gguf_path.stem}-{digest}"


def ensure_gguf_converted(gguf_path: Path, progress: ProgressCallback | None = None) -> Path:
    with gguf_path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ModelFormatError(f"'{gguf_path}' is not a GGUF file (its header is wrong).")
    folder = gguf_cache_folder(gguf_path)
    if is_converted(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    return convert_gguf_to_folder(gguf_path, folder, progress)


def resolve_folder(spec: str, progress: ProgressCallback | None = None) -> Path:
    """The local safetensors folder for a spec, converting or downloading it first if needed."""
    kind = spec_kind(spec)
    if kind == "builtin":
        return ensure_builtin(spec, progress)
    if kind == "gguf":
        return ensure_gguf_converted(Path(spec).expanduser(), progress)
    if kind == "hub":
        return download_model(spec, progress)
    return Path(spec).expanduser()


# ---- checks before transformers sees a folder -----------------------------------------------


def check_safetensors_file(path: Path) -> None:
    """Raise ModelFormatError if a safetensors file's header is unreadable or its data is cut short."""
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            (header_len,) = struct.unpack("<Q", handle.read(8))
            if header_len <= 0 or 8 + header_len > size:
                raise ValueError("header longer than the file")
            header = json.loads(handle.read(header_len))
        data_end = max(
            (entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"),
            default=0,
        )
    except (struct.error, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ModelFormatError(
            f"'{path}' is not a readable safetensors file ({exc}). Download it again."
        ) from exc
    if 8 + header_len + data_end > size:
        raise ModelFormatError(
            f"'{path}' is truncated: it holds {size} bytes but its header describes "
            f"{8 + header_len + data_end}. The download or copy was interrupted; fetch it again."
        )


def check_model_folder(folder: Path) -> list[Path]:
    """The safetensors files of a model folder, after checking it is complete and pickle-free."""
    if not (folder / "config.json").is_file():
        raise ModelFormatError(f"'{folder}' has no config.json, so it is not a Hugging Face model folder.")
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        weight_map = json.loads(index_path.read_text()).get("weight_map", {})
        shards = sorted({folder / name for name in weight_map.values()})
        missing = [shard.name for shard in shards if not shard.is_file()]
        if missing:
            raise ModelFormatError(
                f"'{folder}' is missing weight files {', '.join(missing)}; copy or download them again."
            )
    else:
        shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        pickles = [p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES]
        if pickles:
            raise ModelFormatError(_pickle_refusal(folder / pickles[0]))
        raise ModelFormatError(
            f"'{folder}' holds no .safetensors weights. Tandem loads only safetensors: pickle "
            "checkpoints (.bin) can run arbitrary code on load."
        )
    for shard in shards:
        check_safetensors_file(shard)
    return shards


# ---- loading ---------------------------------------------------------------------------------


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    if not any((folder / name).is_file() for name in TOKENIZER_FILES) and not any(folder.glob("*.tiktoken")):
        raise ModelFormatError(
            f"'{folder}' has no tokenizer (tokenizer.json or tokenizer.model): copy the tokenizer files "
            "from where the model came from into that folder."
        )
    return from_pretrained(AutoTokenizer, folder)


def load_config(spec: str):
    """A model's config without its weights (GGUF: read from the file's metadata)."""
    from transformers import AutoConfig

    spec = resolve_hub_gguf(spec)
    kind = spec_kind(spec)
    if kind == "gguf":
        path = Path(spec).expanduser()
        folder = gguf_cache_folder(path)
        if is_converted(folder):
            return from_pretrained(AutoConfig, folder)
        return from_pretrained(AutoConfig, path.parent, gguf_file=path.name)
    return from_pretrained(AutoConfig, resolve_folder(spec))


def load_model(
    spec: str,
    device: str = "auto",
    dtype: str = "auto",
    progress: ProgressCallback | None = None,
    quantization: str = "none",
    precision: str | None = None,
    kernel: str | None = None,
) -> LoadedModel:
    """Load model and tokenizer.

    `kernel` names the quantized kernel to use (still checked) instead of choosing the fastest here.

    `quantization` is "none", "int8" or "int4" (see engine.models.quantize): the kernel is chosen
    and checked against the float model here, and named in `info["kernel"]`. `precision`
    (fp32, bf16, int8, int4) is the same choice said as a target's precision: it sets the dtype or
    the quantization, and is recorded in `info["precision"]`.
    """
    from transformers import AutoModelForCausalLM

    from engine.models.memory import model_memory_bytes
    from engine.models.quantize import (
        _reloader,
        precision_settings,
        quantization_note,
        quantize_checked,
        validate_mode,
    )

    if precision is not None:
        dtype, quantization = precision_settings(precision, dtype, quantization)
    validate_mode(quantization)
    torch_device = resolve_device(device)
    spec = resolve_hub_gguf(spec, progress)
    native = native_gguf_file(spec, torch_device, precision, quantization, dtype)
    if native is not None:
        return load_native_gguf(spec, native, progress)
    folder = resolve_folder(spec, progress)
    check_model_folder(folder)
    torch_dtype = resolve_dtype(dtype, torch_device)
    tokenizer = load_tokenizer(folder)
    if torch_device.type == "cpu":  # the fast path's kernels: built once, said while it runs
        from engine.kernels import native_ops

        native_ops.build(progress)
    model = from_pretrained(AutoModelForCausalLM, folder, dtype=torch_dtype)
    model.to(torch_device)
    model.eval()
    info = {
        "memory_bytes_before": model_memory_bytes(model),
        "quantization_note": quantization_note(quantization, torch_device),
        "source": spec_kind(spec),
    }
    if quantization != "none":
        if progress is not None:
            progress(f"Choosing an {quantization.upper()} kernel for this machine", 0, 1)
        reload = _reloader(folder, torch_device, torch_dtype, quantization)
        chosen = None
        if kernel is not None:
            from engine.kernels.quant_kernels import KERNELS

            chosen = [KERNELS[kernel]]
        model, kernel_info = quantize_checked(
            model, tokenizer, quantization, torch_device, folder, reload, kernels=chosen
        )
        if progress is not None:
            progress(f"Choosing an {quantization.upper()} kernel for this machine", 1, 1)
        info.update(kernel_info)
        model.eval()
    info["memory_bytes"] = model_memory_bytes(model)
    info["precision"] = precision_name(torch_dtype, quantization)
    return LoadedModel(
        spec, model, tokenizer, torch_device, torch_dtype, quantization, path=folder, info=info
    )


def native_gguf_file(spec: str, device, precision: str | None, quantization: str, dtype: str) -> Path | None:
    """The GGUF file a spec names when it runs on its own blocks: a GGUF (or built-in) model on the
    CPU at its default precision. None for a float or requantized choice, a GPU, or a folder."""
    if (
        device.type != "cpu"
        or precision is not None
        or quantization != "none"
        or dtype not in ("auto", "float32")
    ):
        return None
    kind = spec_kind(spec)
    if kind == "builtin":
        return builtin_gguf_path(builtin_entry(spec))
    if kind == "gguf":
        path = Path(spec).expanduser()
        with path.open("rb") as handle:
            if handle.read(4) != b"GGUF":
                raise ModelFormatError(f"'{path}' is not a GGUF file (its header is wrong).")
        return path
    return None


def gguf_metadata(spec: str, progress: ProgressCallback | None = None) -> Path:
    """The folder with a built-in model's or GGUF file's config and tokenizer, read from the file once
    (engine.models.gguf_native): what a look-up needs, without converting the weights."""
    from engine.models.gguf_native import ensure_metadata, metadata_folder

    if is_builtin(spec):
        path, name = builtin_gguf_path(builtin_entry(spec)), spec.removeprefix(BUILTIN_PREFIX)
    else:
        path, name = Path(spec).expanduser(), None
    return ensure_metadata(path, metadata_folder(path, name), progress)


def load_native_gguf(spec: str, path: Path, progress: ProgressCallback | None = None) -> LoadedModel:
    """A GGUF file on the CPU as it is: its quantized blocks are the target (engine.models.gguf_native)."""
    import torch

    from engine.kernels import native_ops
    from engine.models.gguf_native import load_native, metadata_folder
    from engine.models.memory import model_memory_bytes

    native_ops.build(progress)
    name = spec.removeprefix(BUILTIN_PREFIX) if is_builtin(spec) else None
    folder = metadata_folder(path, name)
    model, tokenizer, info = load_native(path, folder, progress)
    info.update(
        memory_bytes=model_memory_bytes(model),
        quantization_note=(
            f"{info['precision']}: the file's own quantized blocks, computed on as they are "
            "(integer dot products on INT8 activations); its output is this file's, as llama.cpp runs it."
        ),
    )
    cpu = torch.device("cpu")
    return LoadedModel(spec, model, tokenizer, cpu, torch.float32, "gguf", path=folder, info=info)


def precision_name(dtype, quantization: str) -> str:
    """fp32, bf16, fp16, int8 or int4: what a model's weights compute in."""
    if quantization != "none":
        return quantization
    names = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
    return names.get(str(dtype), str(dtype))
