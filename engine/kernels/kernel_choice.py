"""Choosing a quantized kernel: the fastest for the mode and device that passes the check against
the float model here (engine.kernels.quant_check), and why it was chosen.

The candidates (engine.kernels.quant_kernels) are ranked by a brief microbenchmark of the model's
own layer shapes (engine.kernels.kernel_speed, cached per machine), the fused fast path's kernels
first; each is checked on probe text (cached per model, kernel, torch version and CPU features)
and the first that passes is kept. engine.models.quantize adds the settings' note.
"""

from __future__ import annotations

from engine.errors import SettingsError


def choose_checked(
    model, tokenizer, mode: str, device, folder=None, reload=None, kernels: list | None = None
):
    """The float `model` quantized with the fastest kernel that passes the check here, and its info.

    `model` is changed in place when the chosen kernel quantizes after loading. `reload(kernel)`
    loads a load-time (bitsandbytes) kernel's model from the folder; without it those are skipped.
    `kernels` replaces the candidate list and its order (by default: quant_kernels.candidates for
    the mode and device, fastest first as measured here).
    Raises SettingsError when no kernel for the mode runs correctly here.
    """
    import copy

    from engine.kernels import quant_check as qc
    from engine.kernels import quant_kernels as qk
    from engine.kernels.kernel_speed import ranked_by_speed

    if mode == "auto":
        mode = copy_mode(model, device)
    device_type = getattr(device, "type", str(device))
    fingerprint = qc.model_fingerprint(folder, getattr(model, "config", None))
    cache = qc.read_cache()
    ranked = kernels is None
    if kernels is None:
        kernels = qk.candidates(mode, device_type)
    kernels = [k for k in kernels if reload is not None or not k.load_time]
    refused: list[dict] = []
    runnable = []
    for kernel in kernels:
        reason = kernel.unavailable_reason()
        if reason is None:
            runnable.append(kernel)
        else:
            refused.append({"kernel": kernel.name, "reason": f"unavailable ({reason})"})
    speeds = ranked_by_speed(runnable, model, cache, fingerprint) if ranked else {}
    ordered = runnable
    if ranked:  # the fast path's kernels first, then by the microbenchmark's speed
        ordered = sorted(runnable, key=lambda k: (not on_fast_path(k), speeds.get(k.name, float("inf"))))
    probes = qc.probe_inputs(tokenizer, device)
    maxima = reference = None  # from one float forward over the probes, only when needed
    for kernel in ordered:
        key = qc.machine_key(kernel.name, kernel.version, fingerprint)
        cached = cache.get(key, {}).get("check")
        if cached is not None and not cached["passed"]:
            refused.append({"kernel": kernel.name, "reason": _failure(cached, mode), "check": cached})
            continue
        if (cached is None or kernel.smooth) and maxima is None:
            maxima, reference = qc.reference_run(model, probes)
        if kernel.load_time:
            candidate = reload(kernel)
        elif cached is not None:
            candidate = kernel.build(model, maxima)
        else:
            candidate = kernel.build(copy.deepcopy(model), maxima)
        if cached is None:
            result = qc.check_against(reference, candidate, probes, mode).to_dict()
            qc.write_cache_entry(key, {**cache.get(key, {}), "kernel": kernel.name, "check": result})
            if not result["passed"]:
                refused.append({"kernel": kernel.name, "reason": _failure(result, mode), "check": result})
                del candidate
                continue
            cached = result
        faster_than = [r["kernel"] for r in refused if "check" in r]
        reason = "fastest kernel here" if not refused else "fastest kernel here that passed the check"
        if on_fast_path(kernel) and any(
            speeds.get(k.name, 0.0) < speeds.get(kernel.name, 0.0) for k in ordered
        ):
            reason = "the kernel the compiled fast path runs"
        if faster_than:
            reason += f" ({', '.join(faster_than)} failed it)"
        info = {
            "quantization": mode,
            "kernel": kernel.name,
            "kernel_summary": kernel.summary,
            "rounds_activations": kernel.rounds_activations,
            "kernel_reason": reason,
            "kernel_check": cached,
            "kernel_estimated_ms": round(speeds[kernel.name], 3) if kernel.name in speeds else None,
            "kernels_refused": refused,
        }
        return candidate, info
    why = "; ".join(f"{r['kernel']}: {r['reason']}" for r in refused) or "no kernel for this device"
    raise SettingsError(f"No {mode.upper()} kernel runs correctly on this machine ({why}). Choose 'none'.")


def copy_mode(model, device) -> str:
    """The quantization an "auto" copy of the float `model` drafts in: INT4 where its layers are 4-bit
    blocks already on a CPU (a model read from a Q4 GGUF, the built-in one among them: the copy's layers
    then hold the target's own weights, and only its activations and LM head are rounded), INT8
    elsewhere. On the built-in model, greedy, same runs: the INT4 copy kept 95 % of its drafts against
    the INT8 copy's 94 % at a tenth less time a draft token."""
    from engine.kernels import block_quant

    on_cpu = getattr(device, "type", device) == "cpu"
    if on_cpu and block_quant.build_error() is None and block_quant.holds_in_4bit_blocks(model):
        return "int4"
    return "int8"


def on_fast_path(kernel) -> bool:
    """Whether `kernel`'s layers run on the fused, compiled fast path here, vectorized. The layer
    microbenchmark cannot see that: on an AVX-512 EPYC it ranked int8-dynamic-x86 first, and the
    built-in INT8 target then decoded at 56 tok/s, against 92 on int8-block-q8_0."""
    from engine.kernels import block_quant

    return kernel.fast_path and kernel.device_type == "cpu" and block_quant.best_path() != "portable"


def _failure(check: dict, mode: str) -> str:
    from engine.kernels.quant_check import MIN_AGREEMENT

    return (
        f"failed the check: top-1 agreement {check['agreement']:.2f} with the float model "
        f"(needs {MIN_AGREEMENT[mode]:.2f}), max logit error {check['max_logit_error']:.1f}"
    )
