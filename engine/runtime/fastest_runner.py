"""make_runner: the fastest runner a model supports here (FastRunner, else the generic ModelRunner)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from engine.runtime.eager import ModelRunner
from engine.runtime.fastpath import FastRunner
from engine.runtime.protocol import Runner
from engine.runtime.static_forward import unsupported_reason


def make_runner(
    model, device=None, compiled: str = "auto", verify_sizes: Iterable[int] = (), tokens: int | None = None
) -> Runner:
    """The fastest runner this model supports.

    compiled: "auto" compiles on CUDA now and leaves CPU runners eager, to be compiled later
    (ChatEngine.prepare and optimize_in_background): on a small CPU the first build takes a minute
    or more. "on" compiles now wherever it can, "off" never compiles. Models the fast path does not
    support get the generic runner; `runner.notice` says so. `tokens`: the positions its cache holds,
    prompt and reply together (engine.settings.cache_tokens_for for the context chosen; None: the
    default context, never more than the model's own).
    """
    if compiled not in ("auto", "on", "off"):
        raise ValueError(f"compiled must be 'auto', 'on' or 'off', not {compiled!r}")
    reason = unsupported_reason(model)
    if reason is not None:
        runner = ModelRunner(model, device, tokens)
        runner.notice = f"Generic path: {reason}."
        return runner
    runner_device = torch.device(device) if device is not None else next(model.parameters()).device
    compile_now = compiled == "on" or (compiled == "auto" and runner_device.type == "cuda")
    return FastRunner(
        model, device, tokens, compiled="auto" if compile_now else "off", verify_sizes=verify_sizes
    )
