"""A loaded model and the device/dtype helpers; of the engine it imports engine.settings alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.settings import context_length_of


@dataclass
class LoadedModel:
    spec: str
    model: Any  # a transformers PreTrainedModel, in eval mode
    tokenizer: Any
    device: Any  # torch.device
    dtype: Any  # torch.dtype of the activations
    quantization: str = "none"  # "none", "int8", "int4", or "gguf" (a GGUF file on its own blocks)
    path: Path | None = None
    info: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.removeprefix("builtin:") if self.path is None else self.path.name

    @property
    def rounds_activations(self) -> bool:
        """Whether its kernel rounds activations per call (a GGUF file on its own blocks, and the
        quantized kernels that say so in info, engine.kernels.quant_kernels.Kernel): a verify over
        several tokens is then exact only on a runner whose verify rows are row-exact
        (Runner.exact_verify)."""
        return self.quantization == "gguf" or bool(self.info.get("rounds_activations", False))

    @property
    def context_length(self) -> int:
        return context_length_of(self.model.config)

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


def resolve_device(device: str = "auto", must_exist: bool = True):
    """The torch device for "auto", "cpu", "cuda" or "cuda:N"; a DeviceError the user can act on otherwise.

    must_exist=False names a device without requiring it here (a memory estimate for a GPU pair)."""
    import torch

    from engine.errors import DeviceError

    if isinstance(device, torch.device):
        return device
    name = str(device).strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        try:
            chosen = torch.device(name)
        except RuntimeError:
            raise DeviceError(f"'{device}' is not a device: use auto, cpu, cuda or cuda:N.") from None
        if not must_exist:
            return chosen
        if not torch.cuda.is_available():
            build = (
                "this torch is a CPU-only build" if torch.version.cuda is None else "no CUDA GPU is visible"
            )
            raise DeviceError(
                f"--device {device} asks for a CUDA GPU, but {build}. Use --device cpu or auto."
            )
        count = torch.cuda.device_count()
        if chosen.index is not None and chosen.index >= count:
            raise DeviceError(f"--device {device}: this machine has {count} CUDA device(s), numbered from 0.")
        return chosen
    if name == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError("--device mps asks for Apple's Metal GPU, which this machine or torch lacks.")
        return torch.device("mps")
    raise DeviceError(f"Unknown device '{device}': use auto, cpu, cuda or cuda:N.")


def resolve_dtype(dtype: str, device) -> Any:
    import torch

    if not isinstance(dtype, str):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }[dtype]
