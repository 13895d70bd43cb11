"""ChatEngine: one target (and optionally one draft model) serving a chat, turn after turn.

The target's KV cache is kept between turns: a follow-up prompt usually extends the tokens already
cached, so only the new tokens are prefilled. Settings are read at every call, so the GUI can
replace `engine.speculation` / `engine.decoding.sampling` between replies.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.compiled_paths import CompileManager
from engine.decoding import drafter_memory
from engine.decoding.drafters import (
    Drafter,
    ModelDrafter,
    NgramDrafter,
    SuffixDrafter,
    common_prefix_length,
    copy_acceptance_prior,
)
from engine.decoding.planner import DraftPlanner, planner_for
from engine.decoding.pricing import MAX_TREE_SIZE
from engine.decoding.speculative import generate
from engine.decoding.verify_cost import VerifyCostCurve
from engine.drafter_registry import DrafterChoice, choose
from engine.errors import ContextOverflowError
from engine.events import Event, Failed, Finished, ProgressCallback
from engine.models.chat_template import chat_prompt_ids
from engine.models.loaded import LoadedModel
from engine.models.quantize import no_drafting_note
from engine.runtime import calibration
from engine.runtime.cache_transfer import shares_cache_layout
from engine.runtime.fastest_runner import make_runner
from engine.runtime.protocol import Runner
from engine.runtime.threads import ThreadChooser
from engine.settings import SamplingSettings, SpeculationSettings, cache_tokens_for
from engine.stats import GenerationStats

if TYPE_CHECKING:
    from engine.decoding.drafters.head import HeadDrafter

SUFFIX_HISTORY_LEAD = 8  # tokens of the prompt before a reply that go into the suffix index with it
# Verify forwards of K+1 tokens compiled ahead when compilation is on; other sizes run eagerly.
COMPILED_VERIFY_SIZES = (2, 3, 5)


class ChatEngine:
    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        speculation: SpeculationSettings | None = None,
        sampling: SamplingSettings | None = None,
        compiled: str = "auto",
        remember_drafters: bool = False,
        context: int | None = None,
    ):
        """`remember_drafters`: begin from what an earlier start measured of each drafter, and keep
        what this one measures (engine.decoding.drafter_memory), as the app and `chat` / `serve` do.
        `context`: the tokens a conversation may hold, prompt and reply together (None: the default
        context, engine.settings.DEFAULT_CONTEXT_TOKENS; never more than the target's own); the KV
        caches are allocated at that size."""
        self.target = target
        self.compiled = compiled
        self.remember_drafters = remember_drafters
        self.speculation = speculation or SpeculationSettings()
        self.sampling = sampling or SamplingSettings()
        self.chosen_context = context
        tokens = cache_tokens_for(target.model.config, context)
        self._runner = make_runner(target.model, target.device, compiled, COMPILED_VERIFY_SIZES, tokens)
        self._cached_tokens: list[int] = []  # the target cache holds _cached_tokens[: _runner.cache_length]
        self._lock = threading.Lock()
        # a CPU reply runs on the cores other programs leave free (engine.runtime.threads)
        self.threads = ThreadChooser() if target.device.type == "cpu" else None
        self._verify_curve: VerifyCostCurve | None = None
        self._step_time_s: float | None = None
        # adaptive state (acceptance, K) per drafter choice, kept across turns
        self._planners: dict[str, tuple[tuple[int, ...], DraftPlanner]] = {}
        self._ngram: NgramDrafter | None = None
        # the suffix index outlives conversations: earlier replies predict later ones
        self._suffix = SuffixDrafter(self._runner.vocab_size, self._runner.device)
        # more drafters for `auto` to choose among (a draft head, ...); any Drafter
        self.extra_drafters: list[Drafter] = []
        # drafter "head": the head in this folder (None: the one shipped for the target), over
        # head_vocab draft tokens (None: its own; another N is a measurement, see head_drafter)
        self.head_source: str | None = None
        self.head_vocab: int | None = None
        self._head = None
        self.draft: LoadedModel | None = None
        self._model_drafter: ModelDrafter | None = None
        self.tree_graph_later = False  # prepare leaves the token-tree graph for build_tree_graph
        self.compiling = CompileManager(
            target,
            self._runner,
            self._lock,
            compiled,
            head_layers=self._head_layers,
            recalibrate=self._recalibrate,
            trees_have_room=self._trees_have_room,
            step_time=lambda: self._step_time_s,
        )
        self.set_draft(draft)

    # --- models ---------------------------------------------------------------------------------

    def set_draft(self, draft: LoadedModel | None) -> None:
        if draft is not None:
            check_compatible(self.target, draft)
        with self._lock:
            self.draft = draft
            self._model_drafter = None
            if draft is not None:
                tokens = cache_tokens_for(draft.model.config, self.context_length)
                runner = make_runner(draft.model, draft.device, self.compiled, tokens=tokens)
                target = self._runner
                donor = target if shares_cache_layout(target, runner) else None  # it reads prompts from it
                prior = copy_acceptance_prior(self.target, draft)
                self._model_drafter = ModelDrafter(
                    runner, target.vocab_size, draft.name, target.device, donor, prior
                )
            self.compiling.set_draft(draft, self._draft_runner)

    def reset(self) -> None:
        with self._lock:
            self._forget_caches()
            # the same n-gram drafter, emptied: its controller keeps what it measured. A new one per
            # conversation was unmeasured, and `auto` spent each conversation's first match on a probe.
            if self._ngram is not None:
                self._ngram.reset()
            self._suffix.reset()  # the conversation goes; what earlier replies taught the index stays

    # --- generation -----------------------------------------------------------------------------

    def respond(
        self,
        messages: list[dict],
        on_event: Callable[[Event], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Finished:
        """Answers the last user turn of `messages` ([{"role": ..., "content": ...}, ...])."""
        return self.generate_ids(self.prompt_ids(messages), on_event, cancel)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return chat_prompt_ids(self.target.tokenizer, messages)

    def generate_ids(
        self,
        prompt_ids: list[int],
        on_event: Callable[[Event], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Finished:
        """Generates after raw token ids (no template). Failed is sent, then the exception propagates."""
        sampling, speculation = self.sampling, self.speculation
        sampling.validate()
        speculation.validate()
        self.check_fits(prompt_ids)
        with self._lock:
            self.calibrate()
            if self.threads is not None:
                self.threads.choose()
            choice = choose(self, speculation, no_drafting_note(self.target, self._runner))
            planner = self._planner(choice, speculation)
            reused = common_prefix_length(self._cached_tokens[: self._runner.cache_length], prompt_ids)
            self._runner.rollback(reused)
            # the target-alone step time as measured now: calibration, updated by every plain step since
            step_time = self._verify_curve.estimate(1) or self._step_time_s
            stats = GenerationStats(target_step_time_s=step_time, note=choice.note)
            try:
                finished = generate(
                    self._runner,
                    planner,
                    prompt_ids,
                    sampling,
                    speculation,
                    self.target.eos_token_ids,
                    self.target.tokenizer,
                    on_event,
                    cancel,
                    stats=stats,
                )
            except Exception as error:
                self._forget_caches()
                if on_event is not None:
                    on_event(Failed(f"Generation failed: {error}", traceback.format_exc()))
                raise
            finally:
                if self.threads is not None:
                    self.threads.reply_ended()
            self._cached_tokens = list(prompt_ids) + list(finished.token_ids)
            if self.remember_drafters and drafter_memory.enabled():
                drafter_memory.remember(planner, self._drafter_memory_key())
            lead = min(SUFFIX_HISTORY_LEAD, len(prompt_ids))
            reply = prompt_ids[len(prompt_ids) - lead :] + list(finished.token_ids)
            self._suffix.add_history(reply, start=lead)
            return finished

    def forget_history(self) -> None:
        """Empties the suffix index of earlier replies (bench methods must not draft each other's answers)."""
        with self._lock:
            self._suffix.forget_history()

    def add_history(self, sequences: list[list[int]]) -> None:
        """Indexes earlier token sequences (stored conversations) for the suffix drafter."""
        with self._lock:
            for sequence in sequences:
                self._suffix.add_history(list(sequence))

    def calibrate(self, progress=None, use_cache: bool = True) -> float:
        """Seconds per plain target step (one token, warm cache) on this device; measured once per engine.

        Also measures the target's forward time over 2..17 new tokens, which adaptive K starts from.
        The curve is kept per machine and model, so a second start reads it back
        (engine.runtime.calibration.read_back_or_measure); `progress("Measuring this machine", 0, 1)`
        is reported only when it is measured.
        """
        if self._step_time_s is None:
            runner = self._runner  # the engine's own: the figures are those of the path that generates
            self._cached_tokens = []  # measuring empties the target cache
            seconds = calibration.read_back_or_measure(self.target, runner, self.threads, progress, use_cache)
            self._verify_curve = VerifyCostCurve()
            self._verify_curve.seconds = seconds
            self._step_time_s = seconds[1]
        return self._step_time_s

    def measure_forwards(self, sizes, repeats: int = 3, draft: bool = False) -> dict[int, float]:
        """Seconds per forward over n new tokens, for n in `sizes`, on the target (or the draft model's
        runner), measured now; the caches are emptied (a bench's cost figures)."""
        with self._lock:
            runner = self._draft_runner if draft else self._runner
            if runner is self._runner:
                self._cached_tokens = []
            return {} if runner is None else calibration.time_forwards(runner, sizes, repeats)

    def prepare(self, progress=None) -> None:
        """Work before the first reply, so that it does not wait: compiles the forwards (when compilation
        is on, or on CPU with "auto" when an earlier start built them: seconds), measures the verify
        cost (or reads it back from an earlier start), loads the draft head the drafter may use.
        With `tree_graph_later` the token-tree graph is left for build_tree_graph, after "Ready"
        (reading it back made a 10 s start 13 s; until then rounds verify one chain). Call that on
        this same thread: from another one, dynamo traced the graph five times slower."""
        with self._lock:
            self.compiling.warm_up(progress)
            if self.speculation.drafter in ("head", "auto"):  # loaded and checked now, not in a reply
                self.fitting_head()
            # a compiled build from an earlier start first (it measures the runner it switches to), so
            # a restart checks one curve, not the uncompiled runner's and then the compiled one's
            self.compiling.read_back(progress, trees=not self.tree_graph_later)
            self.calibrate(progress)
            if not self.tree_graph_later:
                self.compiling.add_tree_graph(progress)

    # --- compiled paths (engine.compiled_paths) -------------------------------------------------

    @property
    def runs_compiled(self) -> bool:
        """Whether the target's forward runs compiled now."""
        return self.compiling.runs_compiled

    def optimize_in_background(
        self,
        progress: ProgressCallback | None = None,
        on_done: Callable[[str], None] | None = None,
    ) -> bool:
        """Builds the compiled forwards beside the replies and switches to them between replies
        (CompileManager.optimize_in_background); False when there is nothing to build."""
        return self.compiling.optimize_in_background(progress, on_done)

    def build_compiled(self, progress: ProgressCallback | None = None) -> None:
        """Builds now what a CPU start builds in the background (CompileManager.build_compiled)."""
        self.compiling.build_compiled(progress)

    def build_tree_graph(self, progress: ProgressCallback | None = None) -> bool:
        """The token-tree graph that prepare left out (tree_graph_later), where it is due; True once built."""
        return self.compiling.build_tree_graph(progress)

    def _head_layers(self) -> tuple[int, ...]:
        """The target's layers a fitting draft head reads; () where none fits."""
        head = self.fitting_head()
        return tuple(head.wants_hidden) if head is not None else ()

    def _trees_have_room(self) -> bool:
        """Whether trees are on and the measured verify cost gives a tree room: a verify forward one
        token wider than a one-token draft's costing at most what that draft's does."""
        curve = self._verify_curve
        return (
            self.speculation.trees and curve is not None and curve.widest_at_cost(2, limit=MAX_TREE_SIZE) > 2
        )

    def _recalibrate(self, progress=None) -> None:
        """Measures the runner's verify cost again (it changed), keeping the curve object the planners hold."""
        kept = self._verify_curve
        self._step_time_s = None
        self.calibrate(progress)
        if kept is not None:
            kept.replace(self._verify_curve.seconds)
            self._verify_curve = kept

    @property
    def notices(self) -> list[str]:
        """What the user should know about how the models run (no compilation, generic path)."""
        runners = [self._runner, self._draft_runner]
        head = self._head[1].weights if self._head is not None else ""  # at what precision it runs
        optimizing = "Optimizing for this machine in the background; replies run uncompiled until then."
        found = [optimizing] if self.compiling.optimizing else []
        found += [r.notice for r in runners if r is not None] + [self.compiling.notice, head]
        return list(dict.fromkeys(notice for notice in found if notice))

    @property
    def _draft_runner(self) -> Runner | None:
        return self._model_drafter.runner if self._model_drafter is not None else None

    # --- internals -----------------------------------------------------------------------------

    @property
    def context_length(self) -> int:
        """Tokens the target's cache holds, the prompt and the reply together."""
        return self._runner.context_length

    def check_fits(self, prompt_ids: list[int]) -> None:
        """ContextOverflowError when the prompt leaves no room for an answer; callers check before storing."""
        limit = self._runner.context_length
        if len(prompt_ids) + 1 > limit:
            raise ContextOverflowError(context_overflow_message(len(prompt_ids), limit, self.target))

    # --- the drafters it keeps (engine.drafter_registry.DrafterSource) ---------------------------

    def head_drafter(self) -> HeadDrafter:
        """The draft head, loaded on first use (IncompatibleDraftError when none fits the target)."""
        from engine.decoding.drafters.head import head_drafter as load_head

        choice = (self.head_source, self.head_vocab)
        if self._head is None or self._head[0] != choice:
            self._head = (choice, load_head(self.target, self._runner, *choice))
        return self._head[1]

    def fitting_head(self) -> HeadDrafter | None:
        """The draft head for `auto`, when one fits this target (shipped or head_source); else None."""
        from engine.errors import IncompatibleDraftError

        try:
            return self.head_drafter()
        except IncompatibleDraftError:  # none ships for this target, or it was trained for another
            return None

    def ngram_drafter(self, speculation: SpeculationSettings) -> NgramDrafter:
        sizes = (speculation.ngram_min, speculation.ngram_max)
        if self._ngram is None or (self._ngram.ngram_min, self._ngram.ngram_max) != sizes:
            self._ngram = NgramDrafter(self._runner.vocab_size, self._runner.device, *sizes)
        return self._ngram

    def suffix_drafter(self) -> SuffixDrafter:
        return self._suffix

    def model_drafter(self) -> ModelDrafter | None:
        return self._model_drafter

    def _planner(self, choice: DrafterChoice, speculation: SpeculationSettings) -> DraftPlanner:
        """The planner for this drafter choice, kept while its drafters stay the same objects."""
        identity = tuple(id(member) for member in choice.drafters)
        kept = self._planners.get(choice.name)
        if kept is None or kept[0] != identity:
            previous = kept[1] if kept else None
            planner = planner_for(choice.drafters, speculation, self._verify_curve, previous, choice.name)
            if self.remember_drafters and drafter_memory.enabled():
                # the drafters new to this planner begin from what an earlier start measured of them
                inherited = {id(member) for member in previous.drafters} if previous else set()
                new = {member.name for member in planner.drafters if id(member) not in inherited}
                drafter_memory.recall(planner, self._drafter_memory_key(), only=new)
            kept = self._planners[choice.name] = (identity, planner)
        for _, controller in kept[1].members:
            controller.speculation = speculation
        return kept[1]

    def _drafter_memory_key(self) -> str:
        head = repr(self._head[0]) if self._head is not None else ""
        return drafter_memory.memory_key(self.target, self.draft, head)

    def _forget_caches(self) -> None:
        self._runner.reset()
        self._cached_tokens = []
        if self._head is not None:
            self._head[1].reset()
        if self._model_drafter is not None:
            self._model_drafter.reset()


def context_overflow_message(tokens: int, limit: int, target: LoadedModel) -> str:
    """The facts of a conversation of `tokens` tokens that a cache of `limit` cannot hold (ContextOverflowError)."""
    own = target.context_length
    if limit < own:  # the context chosen, shorter than the model's own: the user can choose a longer one
        return (
            f"The conversation is {tokens:,} tokens long, but the context you chose holds {limit:,} tokens, "
            f"including at least one for the answer (choose a longer one, up to {own:,} for {target.name}: "
            "Context in the app's Settings, --context in the terminal)."
        )
    return (
        f"The conversation is {tokens} tokens long, but {target.name} reads at most {limit} tokens, "
        "including at least one for the answer."
    )


def check_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """The draft must share the target's vocabulary. One rule for every caller: engine.models.compat."""
    from engine.models.compat import check_compatible as check_vocabularies

    check_vocabularies(target.tokenizer, draft.tokenizer, target.model.config, draft.model.config)
