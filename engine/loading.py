"""Load a target or draft model with its tokenizer from a model spec.

A spec is one of: `builtin:<name>`, a Hugging Face model folder, a `.gguf` file, or a hub id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.builtin import ProgressCallback, ensure_builtin, is_builtin
from engine.errors import ModelNotFoundError


@dataclass
class LoadedModel:
    spec: str
    model: Any  # a transformers PreTrainedModel, in eval mode
    tokenizer: Any
    device: Any  # torch.device
    dtype: Any  # torch.dtype of the activations
    quantization: str = "none"  # "none", "int8" or "int4"
    path: Path | None = None
    info: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.removeprefix("builtin:") if self.path is None else self.path.name

    @property
    def context_length(self) -> int:
        config = self.model.config
        return int(getattr(config, "max_position_embeddings", None) or 2048)

    @property
    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.model.generation_config, self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids


def resolve_device(device: str = "auto"):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device) -> Any:
    import torch

    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]


def resolve_folder(spec: str, progress: ProgressCallback | None = None) -> Path:
    if is_builtin(spec):
        return ensure_builtin(spec, progress)
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    raise ModelNotFoundError(f"No model at '{spec}': not a built-in name and not a model folder.")


def load_model(
    spec: str,
    device: str = "auto",
    dtype: str = "auto",
    progress: ProgressCallback | None = None,
) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_folder(spec, progress)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype)
    model.to(torch_device).eval()
    return LoadedModel(spec, model, tokenizer, torch_device, torch_dtype, path=folder)
