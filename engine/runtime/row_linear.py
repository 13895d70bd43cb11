"""The fast path's float32 linear layer on a CPU: one pass over the weights for every token of a call.

Decoding and verification multiply a few activation rows by every weight matrix, so a step only
streams the weights. The BLAS GEMM reads them less well at 2 to 8 rows than at one (a 5-token verify
forward cost 1.74 single steps), which is what speculative decoding pays per round.
engine/kernels/native/row_linear.cpp reads each weight row once per call, for all the rows.

Each row's result is computed the same way whatever the number of rows, so a verify forward's rows
are bit for bit what one-token steps give from the same inputs. Calls of up to EXACT_ROWS[path] rows
take the kernel (with AVX-512 that includes short prompts, wide token trees and long verify forwards,
where it also beat the GEMM); more rows (a long prompt) take the BLAS GEMM. Elsewhere (no AVX2, a GPU,
bf16, no compiler, TANDEM_ROW_LINEAR=off) layers use F.linear.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.kernels import native_ops
from engine.kernels.cpu_features import cpu_flags, has_avx2

EXACT_ROWS = {"avx512": 128, "avx2": 16}  # kMaxRows512, kMaxRows256 in row_linear.cpp
# Bumped when row_linear.cpp's speed changes, so that stored verify-cost curves are measured again.
KERNEL_VERSION = 6


def best_path() -> str | None:
    flags = cpu_flags()
    if "avx512f" in flags:
        return "avx512"
    if has_avx2():
        return "avx2"
    return None


@functools.cache
def unavailable_reason() -> str | None:
    """None when the row-exact kernel runs on this machine, else why the fast path uses F.linear."""
    if os.environ.get("TANDEM_ROW_LINEAR", "").lower() == "off":
        return "turned off by TANDEM_ROW_LINEAR=off"
    if best_path() is None:
        return "this CPU has neither AVX-512 nor AVX2"
    error = native_ops.build_error()
    if error is not None:
        return error

    @torch.library.register_fake("tandem_row_linear::linear")
    def _(x, weight, bias, path):
        return x.new_empty(x.shape[0], weight.shape[0])

    return None


def path_for(weight: Tensor) -> str | None:
    """The kernel's code path for a layer with this weight, or None for F.linear."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or unavailable_reason() is not None:
        return None
    return best_path()


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, path: str | None) -> Tensor:
    """F.linear(x, weight, bias), through the row-exact kernel when `path` names one."""
    if path is None:
        return F.linear(x, weight, bias)
    y = torch.ops.tandem_row_linear.linear(x.reshape(-1, x.shape[-1]), weight, bias, path)
    return y.view(*x.shape[:-1], weight.shape[0])


def project(module: nn.Module, x: Tensor, path: str | None) -> Tensor:
    """module(x), through the kernel when `path` names one and `module` is a plain nn.Linear."""
    if path is not None and type(module) is nn.Linear:
        return linear(x, module.weight, module.bias, path)
    return module(x)


def kernel_name(model, versioned: bool = True) -> str:
    """Which linear the fast path runs for this model here, for the keys of cached measurements;
    unversioned for what the kernel's speed does not change (a compiled graph calls it the same way)."""
    weight = next((p for p in model.parameters() if p.dim() == 2), None)
    path = None if weight is None else path_for(weight)
    if path is None:
        return "F.linear"
    return f"row-exact-{path}-v{KERNEL_VERSION}" if versioned else f"row-exact-{path}"


class RowLinear(nn.Linear):
    """An nn.Linear for inference whose forward is the row-exact kernel (same parameters)."""

    path: str

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias, self.path)


def use_in(module: nn.Module) -> int:
    """Runs `module`'s float32 CPU nn.Linear layers on the kernel (in place, sharing their parameters),
    for inference only: the op has no gradient. Returns how many layers now do."""
    swapped = 0
    for child in module.modules():
        if type(child) is nn.Linear and (path := path_for(child.weight)) is not None:
            child.__class__ = RowLinear  # the same object and parameters: only its forward changes
            child.path = path
            swapped += 1
    return swapped
