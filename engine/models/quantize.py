"""Quantized models: "none", "int8" or "int4", for a draft or (as its precision) for the target.

A quantized model is never used unchecked: engine.kernels.kernel_choice picks the fastest kernel
for the mode and device that passes the check against the float model, and says why. Which kernel,
why, and the check's numbers go into LoadedModel.info: "kernel", "kernel_reason", "kernel_check"
({agreement, max_logit_error, ...}), "kernels_refused", and from here "quantization_note".
This module holds the precision settings, their notes, and the load-time (bitsandbytes) arguments.

On CUDA the bitsandbytes modes (LLM.int8, NF4) quantize while loading; INT4 can also use torch's
own int4pack kernel.
"""

from __future__ import annotations

from typing import Any

from engine.errors import SettingsError

QUANTIZATION_MODES = ("none", "int8", "int4")
# a draft's quantization may also be "auto": see engine.kernels.kernel_choice.copy_mode
DRAFT_QUANTIZATIONS = ("auto", *QUANTIZATION_MODES)
PRECISIONS = ("fp32", "bf16", "int8", "int4")


def validate_mode(mode: str) -> None:
    if mode not in QUANTIZATION_MODES:
        raise SettingsError(f"Unknown quantization '{mode}': choose none, int8 or int4.")


def precision_settings(precision: str, dtype: str = "auto", quantization: str = "none") -> tuple[str, str]:
    """(dtype, quantization) for a target precision: fp32, bf16, int8 or int4.

    INT8 and INT4 quantize the fp32 (CPU) or auto-dtype (GPU) weights with the checked kernels. A
    quantized target is not the fp32 target: its own greedy output is what "lossless" means then.
    """
    if precision not in PRECISIONS:
        raise SettingsError(f"Unknown precision '{precision}': choose fp32, bf16, int8 or int4.")
    if precision in ("fp32", "bf16"):
        if quantization != "none":
            raise SettingsError(f"Precision {precision} cannot be combined with {quantization} quantization.")
        return ("float32" if precision == "fp32" else "bfloat16"), "none"
    if quantization not in ("none", precision):
        raise SettingsError(f"Precision {precision} cannot be combined with {quantization} quantization.")
    return dtype, precision


def precision_note(precision: str, device) -> str:
    """One line for a target precision choice: what it costs, and what lossless then means."""
    if precision == "fp32":
        return "fp32: the model's full-precision weights."
    if precision == "bf16":
        on_cuda = getattr(device, "type", device) == "cuda"
        from engine.kernels.cpu_features import cpu_flags

        native = on_cuda or bool({"avx512_bf16", "amx_bf16"} & cpu_flags())
        speed = "" if native else " This CPU has no native bf16, so it is likely slower than fp32."
        return f"bf16 halves the weights' memory; output differs slightly from fp32.{speed}"
    return (
        f"{precision.upper()} target: less memory and, on a CPU, GGUF-style blocks with integer dot "
        "products; its output is its own, not identical to the fp32 model's. Drafting stays exact on "
        "the CPU block kernels, which round each token alike however many are checked at once; where "
        "a kernel rounds them apart, Tandem does not draft for it."
    )


AUTO_NOTE = (
    "Auto: INT4 where the target's layers are 4-bit blocks already (a Q4 GGUF, the built-in model), "
    "so the draft's layers hold the target's own weights; INT8 elsewhere."
)


def quantization_note(mode: str, device) -> str:
    """A one-line note for the settings panel about what this mode costs and saves here."""
    if mode == "auto":
        return AUTO_NOTE
    validate_mode(mode)
    on_cuda = getattr(device, "type", device) == "cuda"
    if mode == "none":
        return ""
    if on_cuda:
        if mode == "int8":
            return "INT8 (bitsandbytes LLM.int8) halves memory but is often slower per token than bf16."
        return "INT4 (bitsandbytes NF4) uses about a quarter of bf16 memory; speed is close to bf16."
    if mode == "int8":
        return "INT8 weights take a quarter of fp32's memory."
    return "INT4 weights take an eighth of fp32's memory."


def load_time_quantization(mode: str, device, dtype) -> dict[str, Any]:
    """Extra from_pretrained arguments for quantizing while loading; empty when done afterwards."""
    from transformers import BitsAndBytesConfig

    if mode == "none" or (mode == "int8" and device.type == "cpu"):
        return {}
    if mode == "int8":
        config = BitsAndBytesConfig(load_in_8bit=True)
    else:
        from engine.kernels.quant_kernels import int4_cpu_unavailable_reason

        if device.type == "cpu" and int4_cpu_unavailable_reason() is not None:
            raise SettingsError(quantization_note("int4", device))
        config = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype
        )
    device_map = "cpu" if device.type == "cpu" else {"": device.index or 0}
    return {"quantization_config": config, "device_map": device_map}


def no_drafting_note(loaded, runner=None) -> str:
    """Why nothing is drafted for this target (its kernel rounds activations), or "" when drafting is
    exact: on a float target, or where `runner`'s verify rows round as its one-token steps do
    (FastRunner.exact_verify, engine.runtime.attention)."""
    if not loaded.rounds_activations or (runner is not None and runner.exact_verify):
        return ""
    return (
        f"No drafting on this target: its kernel ({loaded.info['kernel']}) rounds activations to integers "
        "on each call, so checking several drafted tokens at once could pick a different token than one "
        "step would. It runs alone; on the fast path block-quantized targets (and fp32 and bf16 ones) "
        "keep drafting exact."
    )


def cpu_int8_quantize(model, inplace: bool = True):
    """torch.ao's stock dynamic INT8 of every nn.Linear, unchecked; the report's `int8-dynamic-plain`."""
    import copy

    from engine.kernels.quant_kernels import KERNELS

    return KERNELS["int8-dynamic-plain"].build(model if inplace else copy.deepcopy(model))


# ---- choosing a kernel -----------------------------------------------------------------------


def _kernel_note(mode: str, device, kernel: str, summary: str, refused: list[dict]) -> str:
    base = quantization_note(mode, device)
    if kernel.startswith(("int8-weight", "int4-weight")):
        base += " This weight-only kernel is slower than fp32 on most CPUs."
    line = f"Kernel: {kernel} ({summary})."
    if refused:
        why = "; ".join(f"{r['kernel']}: {r['reason']}" for r in refused)
        line += f" Not used here: {why}."
    return f"{base} {line}".strip()


def quantize_loaded_model(model, tokenizer, folder, dtype, plan, progress=None):
    """A "quantized" load plan's last step (engine.models.loading): the float model just loaded from
    `folder`, quantized with the plan's kernel or the fastest that passes the check here (for a draft
    copy's "auto", in the mode engine.kernels.kernel_choice.copy_mode picks: info["quantization"])."""
    from engine.kernels.quant_kernels import KERNELS

    which = "a quantized" if plan.quantization == "auto" else f"an {plan.quantization.upper()}"
    stage = f"Choosing {which} kernel for this machine"
    if progress is not None:
        progress(stage, 0, 1)
    reload = _reloader(folder, plan.device, dtype)
    chosen = None if plan.kernel is None else [KERNELS[plan.kernel]]
    model, kernel_info = quantize_checked(
        model, tokenizer, plan.quantization, plan.device, folder, reload, kernels=chosen
    )
    if progress is not None:
        progress(stage, 1, 1)
    return model.eval(), kernel_info


def quantize_checked(
    model, tokenizer, mode: str, device, folder=None, reload=None, kernels: list | None = None
):
    """The float `model` quantized with the fastest kernel that passes the check here, and its info
    (engine.kernels.kernel_choice.choose_checked), with the note the settings show for it."""
    from engine.kernels.kernel_choice import choose_checked

    model, info = choose_checked(model, tokenizer, mode, device, folder, reload, kernels)
    info["quantization_note"] = _kernel_note(
        info["quantization"], device, info["kernel"], info["kernel_summary"], info["kernels_refused"]
    )
    return model, info


def quantize_model(loaded, mode: str):
    """A quantized copy of a loaded model, leaving the original untouched.

    Kernels that quantize in memory work on a copy; bitsandbytes kernels reload from the model's folder.
    """
    import copy

    from engine.models.loaded import LoadedModel
    from engine.models.memory import model_memory_bytes

    validate_mode(mode)
    if mode == loaded.quantization:
        return loaded
    if loaded.quantization != "none":
        raise SettingsError("Quantize from the unquantized model, not from an already quantized one.")
    reload = _reloader(loaded.path, loaded.device, loaded.dtype) if loaded.path is not None else None
    source = copy.deepcopy(loaded.model)
    model, kernel_info = quantize_checked(source, loaded.tokenizer, mode, loaded.device, loaded.path, reload)
    info = dict(loaded.info)
    info.update(
        kernel_info,
        memory_bytes_before=model_memory_bytes(loaded.model),
        memory_bytes=model_memory_bytes(model),
    )
    return LoadedModel(
        loaded.spec, model.eval(), loaded.tokenizer, loaded.device, loaded.dtype, mode, loaded.path, info
    )


def _reloader(folder, device, dtype):
    """A function that loads `folder` quantized while loading (bitsandbytes) in a kernel's mode, for
    quantize_checked."""

    def reload(kernel):
        from transformers import AutoModelForCausalLM

        from engine.models.hf import from_pretrained

        extra = load_time_quantization(kernel.mode, device, dtype)
        return from_pretrained(AutoModelForCausalLM, folder, dtype=dtype, **extra).eval()

    return reload
