"""Load a target or draft model with its tokenizer from a model spec.

One path: the spec is parsed once into a source (engine.models.source), a plan is chosen before
anything loads (engine.models.plan: the file's own blocks, a float dtype, or a checked quantized
kernel), and the plan's one loader runs. A hub GGUF file (`owner/repo:Q4_K_M` or
`owner/repo/file.gguf`, engine.models.gguf_hub) is downloaded once first, then loads like any `.gguf`
file. Code shipped with a model is never run.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from engine.errors import ModelFormatError
from engine.events import ProgressCallback
from engine.models.builtin import convert_gguf_to_folder, ensure_builtin, is_converted
from engine.models.gguf_hub import resolve_spec as resolve_hub_gguf
from engine.models.hf import from_pretrained
from engine.models.hub import download_model
from engine.models.loaded import LoadedModel, resolve_dtype
from engine.models.plan import LoadPlan, choose_plan
from engine.models.source import (
    PICKLE_SUFFIXES,
    ModelSource,
    file_key,
    parse_source,
    pickle_refusal,
    spec_kind,
)
from engine.paths import models_cache_dir

__all__ = ["load_model", "load_tokenizer", "load_config", "spec_kind", "resolve_folder", "native_gguf_file"]

# the files a tokenizer is read from: fast, SentencePiece, BPE, WordPiece; *.tiktoken besides
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)


# ---- the float model's folder ----------------------------------------------------------------


def gguf_cache_folder(gguf_path: Path) -> Path:
    """Where a GGUF file's converted safetensors copy lives, keyed by its path, size and mtime."""
    return models_cache_dir() / "gguf" / f"{gguf_path.stem}-{file_key(gguf_path)}"


def ensure_gguf_converted(gguf_path: Path, progress: ProgressCallback | None = None) -> Path:
    folder = gguf_cache_folder(gguf_path)
    if is_converted(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    return convert_gguf_to_folder(gguf_path, folder, progress)


def resolve_folder(spec: str | ModelSource, progress: ProgressCallback | None = None) -> Path:
    """The local safetensors folder for a spec, converting or downloading it first if needed."""
    source = spec if isinstance(spec, ModelSource) else parse_source(spec)
    if source.kind == "builtin":
        return ensure_builtin(source.spec, progress)
    if source.kind == "gguf":
        return ensure_gguf_converted(source.path, progress)
    if source.kind == "hub":
        return download_model(source.spec, progress)
    return source.path


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
            raise ModelFormatError(pickle_refusal(folder / pickles[0]))
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

    source = parse_source(resolve_hub_gguf(spec))
    if source.kind == "gguf":
        folder = gguf_cache_folder(source.path)
        if is_converted(folder):
            return from_pretrained(AutoConfig, folder)
        return from_pretrained(AutoConfig, source.path.parent, gguf_file=source.path.name)
    return from_pretrained(AutoConfig, resolve_folder(source))


def load_model(
    spec: str,
    device: str = "auto",
    dtype: str = "auto",
    progress: ProgressCallback | None = None,
    quantization: str = "none",
    precision: str | None = None,
    kernel: str | None = None,
) -> LoadedModel:
    """Load model and tokenizer as engine.models.plan.choose_plan decides.

    `precision` (fp32, bf16, int8, int4) sets the dtype or the quantization and is recorded in
    `info["precision"]`; `quantization` is "none", "int8" or "int4" (the kernel is chosen and checked
    against the float model here, and named in `info["kernel"]`); `kernel` names the quantized kernel
    to use (still checked) instead of choosing the fastest here.
    """
    source = parse_source(resolve_hub_gguf(spec, progress))
    plan = choose_plan(source, device, dtype, precision, quantization, kernel)
    if plan.kind == "native":
        return load_native_gguf(source, progress)
    return load_folder_model(source, plan, progress)


def native_gguf_file(
    spec: str,
    device: str = "auto",
    dtype: str = "auto",
    precision: str | None = None,
    quantization: str = "none",
) -> Path | None:
    """The GGUF file a spec runs on when its plan is the file's own blocks; None for another plan."""
    source = parse_source(spec)
    plan = choose_plan(source, device, dtype, precision, quantization)
    return source.gguf_file if plan.runs_file_blocks else None


def load_folder_model(source: ModelSource, plan: LoadPlan, progress: ProgressCallback | None) -> LoadedModel:
    """The "float" and "quantized" plans: a safetensors folder (a GGUF converted once), then for the
    latter a kernel checked against the float model (engine.models.quantize)."""
    from transformers import AutoModelForCausalLM

    from engine.models.memory import model_memory_bytes
    from engine.models.quantize import quantization_note, quantize_loaded_model

    folder = resolve_folder(source, progress)
    check_model_folder(folder)
    torch_dtype = resolve_dtype(plan.dtype, plan.device)
    tokenizer = load_tokenizer(folder)
    if plan.device.type == "cpu":  # the fast path's kernels: built once, said while it runs
        from engine.kernels import native_ops

        native_ops.build(progress)
    model = from_pretrained(AutoModelForCausalLM, folder, dtype=torch_dtype)
    model.to(plan.device)
    model.eval()
    info = {
        "memory_bytes_before": model_memory_bytes(model),
        "quantization_note": quantization_note(plan.quantization, plan.device),
        "source": source.kind,
    }
    quantization = plan.quantization
    if plan.kind == "quantized":
        model, kernel_info = quantize_loaded_model(model, tokenizer, folder, torch_dtype, plan, progress)
        info.update(kernel_info)
        quantization = kernel_info["quantization"]  # "auto" resolved
    info["memory_bytes"] = model_memory_bytes(model)
    info["precision"] = precision_name(torch_dtype, quantization)
    return LoadedModel(
        source.spec, model, tokenizer, plan.device, torch_dtype, quantization, path=folder, info=info
    )


def gguf_metadata(spec: str, progress: ProgressCallback | None = None) -> Path:
    """The folder with a built-in model's or GGUF file's config and tokenizer, read from the file once
    (engine.models.gguf_native): what a look-up needs, without converting the weights."""
    from engine.models.gguf_native import ensure_metadata, metadata_folder

    source = parse_source(spec)
    return ensure_metadata(source.gguf_file, metadata_folder(source.gguf_file, source.builtin_name), progress)


def load_native_gguf(source: ModelSource, progress: ProgressCallback | None = None) -> LoadedModel:
    """The "native" plan: a GGUF file on the CPU as it is, its quantized blocks the target
    (engine.models.gguf_native)."""
    import torch

    from engine.kernels import native_ops
    from engine.models.gguf_native import load_native, metadata_folder
    from engine.models.memory import model_memory_bytes

    native_ops.build(progress)
    folder = metadata_folder(source.gguf_file, source.builtin_name)
    model, tokenizer, info = load_native(source.gguf_file, folder, progress)
    info.update(
        memory_bytes=model_memory_bytes(model),
        quantization_note=(
            f"{info['precision']}: the file's own quantized blocks, computed on as they are "
            "(integer dot products on INT8 activations); its output is this file's, as llama.cpp runs it."
        ),
    )
    cpu = torch.device("cpu")
    return LoadedModel(source.spec, model, tokenizer, cpu, torch.float32, "gguf", path=folder, info=info)


def precision_name(dtype, quantization: str) -> str:
    """fp32, bf16, fp16, int8 or int4: what a model's weights compute in."""
    if quantization != "none":
        return quantization
    names = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
    return names.get(str(dtype), str(dtype))
