"""ChatEngine: one target (and optionally one draft model) serving a chat, turn after turn.

The target's KV cache is kept between turns: a follow-up prompt usually extends the tokens already
cached, so only the new tokens are prefilled. Settings are read at every call, so the GUI can
replace `engine.speculation` / `engine.decoding.sampling` between replies.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable

from engine.decoding.adaptive import KController, VerifyCostCurve
from engine.decoding.drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter, common_prefix_length
from engine.decoding.speculative import generate
from engine.errors import ContextOverflowError, IncompatibleDraftError
from engine.events import Event, Failed, Finished
from engine.models.chat_template import chat_prompt_ids
from engine.models.loaded import LoadedModel
from engine.runtime.eager import output_vocab_size
from engine.runtime.fastpath import make_runner
from engine.settings import SamplingSettings, SpeculationSettings
from engine.stats import GenerationStats

CALIBRATION_TOKENS = 64
CALIBRATION_SIZES = (1, 2, 4, 8)
VOCAB_PADDING_TOLERANCE = 128
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
    ):
        self.target = target
        self.compiled = compiled
        self.speculation = speculation or SpeculationSettings()
        self.sampling = sampling or SamplingSettings()
        self._runner = make_runner(target.model, target.device, compiled, COMPILED_VERIFY_SIZES)
        self._cached_tokens: list[int] = []  # the target cache holds _cached_tokens[: _runner.cache_length]
        self._lock = threading.Lock()
        self._verify_curve: VerifyCostCurve | None = None
        self._step_time_s: float | None = None
        self._controllers: dict[str, KController] = {}  # adaptive-K state per drafter, kept across turns
        self._ngram: NgramDrafter | None = None
        self.draft: LoadedModel | None = None
        self._model_drafter: ModelDrafter | None = None
        self.set_draft(draft)

    # --- models ---------------------------------------------------------------------------------

    def set_draft(self, draft: LoadedModel | None) -> None:
        if draft is not None:
            check_compatible(self.target, draft)
        with self._lock:
            self.draft = draft
            if self._model_drafter is not None:
                self._controllers.pop(self._model_drafter.name, None)
            self._model_drafter = (
                ModelDrafter(
                    make_runner(draft.model, draft.device, self.compiled), self._runner.vocab_size, draft.name
                )
                if draft is not None
                else None
            )

    def reset(self) -> None:
        with self._lock:
            self._runner.reset()
            self._cached_tokens = []
            if self._model_drafter is not None:
                self._model_drafter.reset()
            self._ngram = None

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
        self._check_fits(prompt_ids)
        with self._lock:
            self.calibrate()
            drafter, note = self._choose_drafter(speculation)
            controller = self._controller(drafter, speculation)
            reused = common_prefix_length(self._cached_tokens[: self._runner.cache_length], prompt_ids)
            self._runner.rollback(reused)
            # the target-alone step time as measured now: calibration, updated by every plain step since
            step_time = self._verify_curve.estimate(1) or self._step_time_s
            stats = GenerationStats(target_step_time_s=step_time, note=note)
            try:
                finished = generate(
                    self._runner, drafter, prompt_ids, sampling, speculation, self.target.eos_token_ids,
                    self.target.tokenizer, on_event, cancel, controller=controller, stats=stats,
                )  # fmt: skip
            except Exception as error:
                self._forget_caches()
                if on_event is not None:
                    on_event(Failed(f"Generation failed: {error}", traceback.format_exc()))
                raise
            self._cached_tokens = list(prompt_ids) + list(finished.token_ids)
            return finished

    def calibrate(self, progress=None, use_cache: bool = True) -> float:
        """Seconds per plain target step (one token, warm cache) on this device; measured once per engine.

        Also measures the target's forward time over 2, 4 and 8 new tokens, which adaptive K starts from.
        The curve is kept per machine and model (engine/runtime/calibration.py), so a second start reads
        it back; `progress("Measuring this machine", 0, 1)` is reported only when it is measured.
        """
        if self._step_time_s is None:
            from engine.runtime import calibration

            # Measured on the engine's own runner, so the figures are those of the path that generates.
            runner = self._runner
            key = calibration.calibration_key(self.target, runner)
            stored = calibration.load(key) if use_cache else None
            if stored is not None:
                self._verify_curve = VerifyCostCurve()
                self._verify_curve.seconds = stored
            else:
                if progress is not None:
                    progress("Measuring this machine", 0, 1)
                vocab = runner.vocab_size
                runner.reset()
                self._cached_tokens = []
                runner.prefill([(1000 + i) % vocab for i in range(CALIBRATION_TOKENS)])
                self._verify_curve = VerifyCostCurve().measure(runner, CALIBRATION_SIZES)
                runner.reset()
                calibration.save(key, self._verify_curve.seconds)
            self._step_time_s = self._verify_curve.seconds[1]
        return self._step_time_s

    def prepare(self, progress=None) -> None:
        """Work before the first reply, so that it does not wait: compiles the forwards (when compilation
        is on), then measures the verify cost (or reads it back from an earlier start)."""
        with self._lock:
            for runner in (self._runner, getattr(self._model_drafter, "runner", None)):
                if runner is not None and getattr(runner, "is_compiled", False):
                    runner.warm_up(progress=progress)
            self.calibrate(progress)

    @property
    def notices(self) -> list[str]:
        """What the user should know about how the models run (no compilation, generic path)."""
        runners = [self._runner, getattr(self._model_drafter, "runner", None)]
        return list(dict.fromkeys(r.notice for r in runners if r is not None and r.notice))

    # --- internals -----------------------------------------------------------------------------

    def _check_fits(self, prompt_ids: list[int]) -> None:
        limit = self._runner.context_length
        if len(prompt_ids) + 1 > limit:
            raise ContextOverflowError(
                f"The conversation is {len(prompt_ids)} tokens long, but {self.target.name} reads at most "
                f"{limit} tokens, including at least one for the answer. Start a new chat or delete earlier messages."
            )

    def _choose_drafter(self, speculation: SpeculationSettings) -> tuple[Drafter, str]:
        kind, note = speculation.drafter, ""
        if kind == "model" and self._model_drafter is None:
            kind, note = "ngram", "No draft model is loaded, so drafting uses n-gram lookup."
        if kind == "model":
            return self._model_drafter, note
        if kind == "ngram":
            sizes = (speculation.ngram_min, speculation.ngram_max)
            if self._ngram is None or (self._ngram.ngram_min, self._ngram.ngram_max) != sizes:
                self._ngram = NgramDrafter(self._runner.vocab_size, self._runner.device, *sizes)
            return self._ngram, note
        return NoDrafter(self._runner.vocab_size, self._runner.device), note

    def _controller(self, drafter: Drafter, speculation: SpeculationSettings) -> KController:
        controller = self._controllers.get(drafter.name)
        if controller is None:
            controller = self._controllers[drafter.name] = KController(speculation, self._verify_curve)
        controller.speculation = speculation
        return controller

    def _forget_caches(self) -> None:
        self._runner.reset()
        self._cached_tokens = []
        if self._model_drafter is not None:
            self._model_drafter.reset()


def check_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """The draft must share the target's vocabulary: the same token for every id, the same end tokens."""
    target_size, draft_size = output_vocab_size(target.model), output_vocab_size(draft.model)
    if abs(target_size - draft_size) > VOCAB_PADDING_TOLERANCE:
        raise IncompatibleDraftError(
            f"{draft.name} has {draft_size} tokens and {target.name} has {target_size}: "
            "a draft model must use the target's tokenizer."
        )
    if draft.tokenizer is not target.tokenizer:
        target_vocab, draft_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
        if target_vocab != draft_vocab:
            by_id = {i: t for t, i in draft_vocab.items()}
            differing = next(
                (t for t, i in sorted(target_vocab.items(), key=lambda x: x[1]) if by_id.get(i) != t), "?"
            )
            raise IncompatibleDraftError(
                f"{draft.name} and {target.name} use different tokenizers (first difference: token "
                f"{target_vocab.get(differing, '?')} is {differing!r} in the target and "
                f"{by_id.get(target_vocab.get(differing))!r} in the draft)."
            )
    if draft.eos_token_ids and target.eos_token_ids and not draft.eos_token_ids & target.eos_token_ids:
        raise IncompatibleDraftError(f"{draft.name} and {target.name} end replies with different tokens.")
