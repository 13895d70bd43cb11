"""ChatEngine's compiled paths: building them in a helper process beside the replies, switching to them
between replies, the token-tree graph, and the draft model's own compiled forward. A part of ChatEngine
(engine.session) kept in a module of its own; it reads the engine's runners, lock and settings."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

from engine.decoding.adaptive import MAX_TREE_SIZE
from engine.models.quantize import no_drafting_note


class CompiledPaths:
    @property
    def runs_compiled(self) -> bool:
        """Whether the target's forward runs compiled now."""
        return bool(getattr(self._runner, "is_compiled", False))

    def optimize_in_background(
        self,
        progress: Callable[[str, int, int], None] | None = None,
        on_done: Callable[[str], None] | None = None,
    ) -> bool:
        """With compiled="auto" on CPU, when the compiled forward is not built yet: builds it in a
        helper process (engine.runtime.compile_build) while replies run eagerly, then compiles it
        from inductor's cache between replies (seconds), switches to it and measures its verify cost.
        Then the same for a draft model's forward (a quantized copy), where one drafts.

        progress(stage, done, total) reports each step; on_done(message) says how it ended, in words
        for the user. False when there is nothing to build: compiled is not "auto", the runners are
        compiled already or cannot be, TANDEM_COMPILE=off, or a second copy would not fit in memory
        (`notices` then says so).
        """
        from engine.runtime import compile_build

        target_due = self._may_compile_later()
        if not (target_due or self._draft_to_compile()) or self._optimizer is not None:
            return False
        if not compile_build.helper_fits(self.target):
            self._compile_notice = (
                "Running without compilation: building it beside the app would need a second copy of the "
                "model in memory. Set 'compiled' to 'on' to build it at load time instead."
            )
            return False
        capture = self._compiled_capture()

        def build() -> None:
            self._optimizing = True
            failure, eager_step_s = None, self._step_time_s if target_due else None
            if target_due:
                failure = compile_build.build_in_helper(self.target, capture, progress)
                if failure is None:
                    with self._lock:  # between replies
                        failure = self._compile_from_cache(progress)
            if failure is None and self._draft_to_compile() is not None:
                draft_failure = compile_build.build_in_helper(self.draft, (), progress)
                with self._lock:
                    self._compile_draft(progress, draft_failure)
            self._optimizing, self._compile_notice = False, failure or ""
            if on_done is not None:
                on_done(compile_build.outcome(failure, eager_step_s, self._step_time_s))

        self._optimizer = threading.Thread(target=build, name="tandem-optimize", daemon=True)
        self._optimizer.start()
        return True

    def _may_compile_later(self, runner=None) -> bool:
        """Whether the target's runner (or `runner`) is eager now and may be compiled on this CPU."""
        runner = self._runner if runner is None else runner
        return (
            self.compiled == "auto"
            and hasattr(runner, "compile_now")
            and not runner.is_compiled
            and runner.compile_refusal() is None
            and os.environ.get("TANDEM_COMPILE", "").lower() != "off"
            and not getattr(sys, "frozen", False)  # a bundled app has no interpreter to run the helper with
        )

    def _compiled_capture(self) -> tuple[int, ...]:
        """The features the compiled forward always returns: the layers a fitting draft head reads."""
        if no_drafting_note(self.target, self._runner):  # nothing drafts for it, the head included
            return ()
        head = self.fitting_head()
        return tuple(head.wants_hidden) if head is not None else ()

    def _compile_from_cache(self, progress=None, trees: bool = True) -> str | None:
        """Compiles the target's forward (seconds from inductor's cache), switches to it and measures
        it; None when done, else why not (the runner stays eager). Holds no lock itself."""
        self._runner.compiled_capture = self._compiled_capture()
        if not self._runner.compile_now(progress):
            return self._runner.notice or "Running without compilation."
        self._recalibrate(progress)
        if trees:
            self._build_tree_graph(progress)
        return None

    def build_tree_graph(self, progress=None) -> bool:
        """The token-tree graph that prepare left out (tree_graph_later), where it is due; True once built."""
        with self._lock:
            return self._build_tree_graph(progress)

    def _build_tree_graph(self, progress=None) -> bool:
        """A compiled CPU runner verifies token trees on a graph of its own, and none without it (the
        uncompiled forward rounds apart from the compiled steps). That graph is one more to read back
        at every start (seconds), so it is built only where the measured cost gives a tree room: a
        verify forward one token wider than a one-token draft's costing at most what that draft's does."""
        if self._tree_graph_due():
            self._runner.warm_up(progress=progress, trees=True)
        return getattr(self._runner, "tree_graph", False)

    def _tree_graph_due(self) -> bool:
        runner = self._runner
        compiled_cpu = getattr(runner, "is_compiled", False) and getattr(runner, "dynamic_shapes", False)
        if not compiled_cpu or runner.tree_graph or not self.speculation.trees or self._verify_curve is None:
            return False
        return self._verify_curve.widest_at_cost(2, limit=MAX_TREE_SIZE) > 2

    def _draft_to_compile(self):
        """The draft model's runner where it may be compiled as the target's is (a quantized copy on a
        CPU: its draft step took 0.68 of a compiled target step eager); None otherwise."""
        runner = getattr(self._model_drafter, "runner", None)
        return runner if runner is not None and self._may_compile_later(runner) else None

    def build_compiled(self, progress=None) -> None:
        """What a CPU start builds in the background (the target's compiled forward, then a draft
        model's), built now in the helper where no earlier start built it: a minute or two, once per
        machine. The bench calls it before prepare, which then reads them back, so that it measures
        the runners the app switches to; a build that fails leaves a notice."""
        from engine.runtime import compile_build

        with self._lock:
            if self._may_compile_later():
                capture = self._compiled_capture()
                self._compile_notice = compile_build.ensure_built(self.target, capture, progress) or ""
            if self._draft_to_compile() is not None:
                self._compile_draft(progress, compile_build.ensure_built(self.draft, (), progress))

    def _compile_draft(self, progress=None, build_failure: str | None = None) -> None:
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
