"""Compiled forwards saved ahead of time, read back at the next start without tracing the model again.

Inductor's cache keeps the kernels it generated, but every start still traces the model's Python with
dynamo to find them again: about 5 s a graph for the built-in model on two cores, 10 s before the
compiled path serves. `torch.compile(...).aot_compile` packages a traced and compiled forward into a
file that loads in a fraction of a second (about 2 s for the first in a process, then 0.06 s each).

Used for the CPU forward with dynamic shapes whose attention runs on Tandem's row kernel, and there
for the calls without a mask (decode steps, verify forwards, prompt chunks): such a call reads its
tensors, the layers it captures and `exact_rows`, and not its window. A saved forward keeps no dynamo
guards (those on the model's modules cannot be saved), so the file names carry what tells one graph
from another: one token or several (that graph is traced with its length dynamic), the captured
layers, exact_rows. Token trees and masked calls go through torch.compile as before, and so does
any call whose file fails to build or load (`failure` says why).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

SAVED_FORMAT = 1  # bumped when what a saved file holds, or how it is named, changes


def _keep_no_guards(entries) -> list[bool]:
    return [False for _ in entries]


class PrecompiledForward:
    """Calls like the torch.compile'd forward it wraps (`compiled`), from files saved in the folder
    `folder()` names at the time of the call; while it names none, it only passes calls through."""

    def __init__(self, compiled: Callable, module: torch.nn.Module, folder: Callable[[], Path | None]):
        self.compiled, self.module, self.folder = compiled, module, folder
        self.loaded: dict[str, Callable] = {}  # file name -> forward read back or built this run
        self.built: list[str] = []  # the files this run traced and saved
        self.failure = ""
        self._failed: set[str] = set()

    def __call__(self, ids, positions, mask, slots, window, capture, exact_rows: bool = False):
        name = self._file_name(ids, mask, slots, capture, exact_rows)
        forward = (
            self._forward(name, (ids, positions, mask, slots, window, capture), exact_rows) if name else None
        )
        if forward is None:
            return self.compiled(ids, positions, mask, slots, window, capture, exact_rows=exact_rows)
        return forward(self.module, ids, positions, mask, slots, window, capture, exact_rows=exact_rows)

    def _file_name(self, ids, mask, slots, capture, exact_rows: bool) -> str | None:
        if self.folder() is None or mask is not None or slots is not None or not self.module.row_attention:
            return None
        tokens = "one" if ids.shape[-1] == 1 else "several"
        layers = "-".join(str(layer) for layer in sorted(capture)) or "none"
        return f"{tokens}-tokens_layers-{layers}{'_exact-rows' if exact_rows else ''}.pt"

    def _forward(self, name: str, args: tuple, exact_rows: bool) -> Callable | None:
        if name in self.loaded or name in self._failed:
            return self.loaded.get(name)
        path = self.folder() / name
        try:
            if path.is_file():
                with path.open("rb") as file:
                    forward = torch.compiler.load_compiled_function(file)
            else:
                forward = self._build(args, exact_rows)
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_suffix(f".{os.getpid()}.partial")
                forward.save_compiled_function(str(partial))
                partial.replace(path)  # whole or absent: a build killed midway leaves no file to read
                self.built.append(name)
        except Exception as error:  # noqa: BLE001 - an experimental API: this call compiles as before
            self._failed.add(name)
            self.failure = f"{type(error).__name__}: {error}"
            return None
        self.loaded[name] = forward
        return forward

    def _build(self, args: tuple, exact_rows: bool) -> Callable:
        ids, positions, *rest = args
        if ids.shape[-1] > 1:  # one graph for every length of two tokens or more
            ids, positions = ids.clone(), positions.clone()
            torch._dynamo.mark_dynamic(ids, 1)
            torch._dynamo.mark_dynamic(positions, 0)
        compiled = torch.compile(
            self.module, dynamic=True, fullgraph=True, options={"guard_filter_fn": _keep_no_guards}
        )
        return compiled.forward.aot_compile(((ids, positions, *rest), {"exact_rows": exact_rows}))


def saving_supported() -> bool:
    """Whether this torch can save compiled forwards (torch.compile(...).aot_compile, torch 2.10 on)."""
    return hasattr(torch.compiler, "load_compiled_function")
