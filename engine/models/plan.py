"""How a model will be loaded, chosen before anything loads.

Three plans, one loader each (engine.models.loading):
- "native": a GGUF file (or the built-in model) on a CPU at its default precision runs in the file's
  own quantized blocks (engine.models.gguf_native);
- "float": a safetensors folder (a GGUF is converted to one first) at a float dtype;
- "quantized": the float model quantized to INT8 or INT4 with a kernel checked against it
  (engine.models.quantize).
A draft's plan follows from its target's (engine.models.pair): a quantized copy drafts only for a
target that computes in floats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from engine.models.source import ModelSource

PlanKind = Literal["native", "float", "quantized"]
NATIVE_DTYPES = ("auto", "float32")  # a native target computes its activations in fp32


@dataclass(frozen=True)
class LoadPlan:
    kind: PlanKind
    device: Any  # torch.device
    dtype: str  # "auto", "float32", "bfloat16", "float16": the float dtype asked for
    quantization: str  # "none", "int8", "int4", "auto" (a draft copy's, resolved as it is quantized); "gguf" for a native plan
    precision: str | None = None  # fp32, bf16, int8, int4 as the user said it; None: the default
    kernel: str | None = None  # a named quantized kernel instead of the fastest here (still checked)

    @property
    def runs_file_blocks(self) -> bool:
        return self.kind == "native"


def choose_plan(
    source: ModelSource,
    device: str = "auto",
    dtype: str = "auto",
    precision: str | None = None,
    quantization: str = "none",
    kernel: str | None = None,
) -> LoadPlan:
    """The plan for a source: its precision (fp32, bf16, int8, int4) or dtype and quantization said
    as asked, on the device. SettingsError for an unknown precision or quantization."""
    from engine.models.loaded import resolve_device
    from engine.models.quantize import precision_settings, validate_mode

    if precision is not None:
        dtype, quantization = precision_settings(precision, dtype, quantization)
    if quantization != "auto":  # a draft copy's: engine.kernels.kernel_choice.copy_mode
        validate_mode(quantization)
    torch_device = resolve_device(device)
    on_its_blocks = precision is None and quantization == "none" and dtype in NATIVE_DTYPES
    if source.is_gguf and torch_device.type == "cpu" and on_its_blocks:
        return LoadPlan("native", torch_device, "float32", "gguf")
    kind: PlanKind = "float" if quantization == "none" else "quantized"
    return LoadPlan(kind, torch_device, dtype, quantization, precision, kernel)
