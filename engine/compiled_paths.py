"""The engine's compiled paths: building them in a helper process beside the replies, switching to them
between replies, the token-tree graph, and the draft model's own compiled forward.

`CompileManager` owns that job for one ChatEngine (engine.session): it is handed the target, its
runner and the lock replies hold, and asks the engine only what the engine knows: the layers a
fitting draft head reads, the verify cost measured again, whether that cost gives token trees room.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

from engine.events import ProgressCallback
from engine.models.loaded import LoadedModel
from engine.models.quantize import no_drafting_note
from engine.runtime.protocol import CompilingRunner, Runner


class CompileManager:
    """Compiles the target's forward (and a draft model's) where it may, and says why where it did not.

    `mode` is ChatEngine's `compiled` ("auto", "on" or "off"). The engine hands it:
      head_layers()        the hidden-state layers a fitting draft head reads (the compiled forward
                           always returns them), () where none fits;
      recalibrate(p)       measures the target's verify cost again (the runner changed);
      trees_have_room()    whether token trees are on and the measured verify cost gives them room;
      step_time()          seconds per plain target step as measured now, or None.
    Methods named `build_*` and `optimize_in_background` take the lock themselves; the others are for
    a caller that holds it (ChatEngine.prepare).
    """

    def __init__(
        self,
        target: LoadedModel,
        runner: Runner,
        lock: threading.Lock,
        mode: str,
        *,
        head_layers: Callable[[], tuple[int, ...]],
        recalibrate: Callable[[ProgressCallback | None], None],
        trees_have_room: Callable[[], bool],
        step_time: Callable[[], float | None],
    ):
        self.target, self.runner, self.lock, self.mode = target, runner, lock, mode
        self.head_layers, self.recalibrate = head_layers, recalibrate
        self.trees_have_room, self.step_time = trees_have_room, step_time
        self.draft: LoadedModel | None = None
        self.draft_runner: Runner | None = None
        self.notice = ""  # why a compiled forward was not built, when it was not
        self.optimizing = False  # while the background build runs (until it has switched)
        self._optimizer: threading.Thread | None = None

    def set_draft(self, draft: LoadedModel | None, runner: Runner | None) -> None:
        """The draft model whose forward is compiled as the target's is, and its runner (None: none)."""
        self.draft, self.draft_runner = draft, runner

    @property
    def runs_compiled(self) -> bool:
        """Whether the target's forward runs compiled now."""
        return self.runner.is_compiled

    def optimize_in_background(
        self,
        progress: ProgressCallback | None = None,
        on_done: Callable[[str], None] | None = None,
    ) -> bool:
        """With mode "auto" on CPU, when the compiled forward is not built yet: builds it in a helper
        process (engine.runtime.compile_build) while replies run eagerly, then compiles it from
        inductor's cache between replies (seconds), switches to it and measures its verify cost.
        Then the same for a draft model's forward (a quantized copy), where one drafts.

        progress(stage, done, total) reports each step; on_done(message) says how it ended, in words
        for the user. False when there is nothing to build: mode is not "auto", the runners are
        compiled already or cannot be, TANDEM_COMPILE=off, or a second copy would not fit in memory
        (`notice` then says so).
        """
        from engine.runtime import compile_build

        target_due = self.may_compile_later()
        if not (target_due or self._draft_to_compile()) or self._optimizer is not None:
            return False
        if not compile_build.helper_fits(self.target):
            self.notice = (
                "Running without compilation: building it beside the app would need a second copy of the "
                "model in memory. Set 'compiled' to 'on' to build it at load time instead."
            )
            return False
        capture = self.compiled_capture()

        def build() -> None:
            self.optimizing = True
            failure, eager_step_s = None, self.step_time() if target_due else None
            if target_due:
                failure = compile_build.build_in_helper(self.target, capture, progress)
                if failure is None:
                    with self.lock:  # between replies
                        failure = self.compile_from_cache(progress)
            if failure is None and self._draft_to_compile() is not None:
                draft_failure = compile_build.build_in_helper(self.draft, (), progress)
                with self.lock:
                    self.compile_draft(progress, draft_failure)
            self.optimizing, self.notice = False, failure or ""
            if on_done is not None:
                on_done(compile_build.outcome(failure, eager_step_s, self.step_time()))

        self._optimizer = threading.Thread(target=build, name="tandem-optimize", daemon=True)
        self._optimizer.start()
        return True

    def build_compiled(self, progress: ProgressCallback | None = None) -> None:
        """What a CPU start builds in the background (the target's compiled forward, then a draft
        model's), built now in the helper where no earlier start built it: a minute or two, once per
        machine. The bench calls it before prepare, which then reads them back, so that it measures
        the runners the app switches to; a build that fails leaves a notice."""
        from engine.runtime import compile_build

        with self.lock:
            if self.may_compile_later():
                capture = self.compiled_capture()
                self.notice = compile_build.ensure_built(self.target, capture, progress) or ""
            if self._draft_to_compile() is not None:
                self.compile_draft(progress, compile_build.ensure_built(self.draft, (), progress))

    def build_tree_graph(self, progress: ProgressCallback | None = None) -> bool:
        """The token-tree graph that prepare left out (ChatEngine.tree_graph_later), where it is due;
        True once built."""
        with self.lock:
            return self.add_tree_graph(progress)

    # --- for a caller that holds the lock --------------------------------------------------------

    def warm_up(self, progress: ProgressCallback | None = None) -> None:
        """Before the first reply: tells a compiled (or later compiled) target runner where its saved
        forwards are, and compiles the forwards of the runners that are compiled already."""
        from engine.runtime import compile_build

        runner = self.runner.compiling()
        if runner is not None and (runner.is_compiled or self.may_compile_later()):
            capture = runner.compiled_capture = self.compiled_capture()
            # its compiled forwards are saved there, and read back at the next start in seconds
            runner.precompiled_folder = compile_build.precompiled_folder(self.target, capture)
        for each in (self.runner, self.draft_runner):
            if each is not None and each.is_compiled:
                each.compiling().warm_up(progress=progress)

    def read_back(self, progress: ProgressCallback | None = None, trees: bool = True) -> None:
        """A CPU build that an earlier start (or build_compiled) finished: seconds from inductor's
        cache, before "Ready"; then the draft model's, where it has one. `trees`: the token-tree
        graph too, where it is due."""
        from engine.runtime import compile_build

        if self.may_compile_later() and compile_build.is_built(self.target, self.compiled_capture()):
            self.notice = self.compile_from_cache(progress, trees) or ""
        self.compile_draft(progress)

    def add_tree_graph(self, progress: ProgressCallback | None = None) -> bool:
        """A compiled CPU runner verifies token trees on a graph of its own, and none without it (the
        uncompiled forward rounds apart from the compiled steps). That graph is one more to read back
        at every start (seconds), so it is built only where the measured cost gives a tree room: a
        verify forward one token wider than a one-token draft's costing at most what that draft's does."""
        runner = self.runner.compiling()
        if runner is None:
            return False
        if runner.is_compiled and runner.dynamic_shapes and not runner.tree_graph and self.trees_have_room():
            runner.warm_up(progress=progress, trees=True)
        return runner.tree_graph

    def may_compile_later(self, runner: Runner | None = None) -> bool:
        """Whether the target's runner (or `runner`) is eager now and may be compiled on this CPU."""
        compiling = (self.runner if runner is None else runner).compiling()
        return (
            self.mode == "auto"
            and compiling is not None
            and not compiling.is_compiled
            and compiling.compile_refusal() is None
            and os.environ.get("TANDEM_COMPILE", "").lower() != "off"
            and not getattr(sys, "frozen", False)  # a bundled app has no interpreter to run the helper with
        )

    def compiled_capture(self) -> tuple[int, ...]:
        """The features the compiled forward always returns: the layers a fitting draft head reads."""
        if no_drafting_note(self.target, self.runner):  # nothing drafts for it, the head included
            return ()
        return self.head_layers()

    def compile_from_cache(self, progress: ProgressCallback | None = None, trees: bool = True) -> str | None:
        """Compiles the target's forward (seconds from inductor's cache), switches to it and measures
        it; None when done, else why not (the runner stays eager)."""
        runner = self.runner.compiling()
        if runner is None:
            return "Running without compilation."
        runner.compiled_capture = self.compiled_capture()
        if not runner.compile_now(progress):
            return runner.notice or "Running without compilation."
        self.recalibrate(progress)
        if trees:
            self.add_tree_graph(progress)
        return None

    def compile_draft(
        self, progress: ProgressCallback | None = None, build_failure: str | None = None
    ) -> None:
        """Compiles the draft model's forward where a build holds it (seconds); where its build failed
        (`build_failure`) it stays eager, and its runner's notice says why."""
        from engine.runtime import compile_build

        runner = self._draft_to_compile()
        if runner is None:
            return
        runner.precompiled_folder = compile_build.precompiled_folder(self.draft, ())
        if build_failure:
            runner.notice = (
                f"The draft model drafts uncompiled: {build_failure.removeprefix(compile_build.UNCOMPILED)}"
            )
        elif compile_build.is_built(self.draft, ()):
            runner.compile_now(progress)

    def _draft_to_compile(self) -> CompilingRunner | None:
        """The draft model's runner where it may be compiled as the target's is (a quantized copy on a
        CPU: its draft step took 0.68 of a compiled target step eager); None otherwise."""
        runner = self.draft_runner
        if runner is not None and self.may_compile_later(runner):
            return runner.compiling()
        return None
