"""What the benchmark compares: Tandem's loop with each drafter, and transformers' generate."""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.bench.records import Tally, TurnResult, tally_from_stats
from engine.errors import SettingsError

# llama-cpp, llama-cpp-spec, llama-cpp-f32: llama.cpp's llama-server on the same GGUF, or its F32 copy
# (engine/bench/llama_cpp.py);
# baseline-eager: the target alone on the uncompiled fast path, beside a compiled baseline
METHOD_KINDS = (
    "baseline",
    "baseline-eager",
    "tandem",
    "tandem-ngram",
    "tandem-suffix",
    "tandem-head",
    "tandem-auto",
    "hf-assisted",
    "hf-lookup",
    "hf-plain",
    "llama-cpp",
    "llama-cpp-spec",
    "llama-cpp-f32",
)


K_SWEPT_KINDS = ("tandem", "tandem-ngram", "tandem-suffix", "tandem-head", "tandem-auto")


HF_KINDS = ("hf-assisted", "hf-lookup", "hf-plain")


@dataclass(frozen=True)
class Method:
    name: str  # e.g. "tandem[k=4]"
    kind: str  # one of METHOD_KINDS
    k: int | None = None  # draft length for tandem kinds; None is adaptive

    @property
    def k_label(self) -> str:
        return "adaptive" if self.k is None else str(self.k)


def parse_k_values(values: list[str] | None) -> list[int | None]:
    """--k values: 'adaptive' (None) or integers 1-16, in the order given, without repeats."""
    from engine.settings import MAX_K

    parsed: list[int | None] = []
    for value in values or ["adaptive"]:
        if str(value).lower() == "adaptive":
            k = None
        else:
            try:
                k = int(value)
            except ValueError:
                raise SettingsError(
                    f"--k must be 'adaptive' or an integer from 1 to {MAX_K}, not '{value}'."
                ) from None
            if not 1 <= k <= MAX_K:
                raise SettingsError(f"--k must be between 1 and {MAX_K}, not {k}.")
        if k not in parsed:
            parsed.append(k)
    return parsed


def expand_methods(kinds: list[str], k_values: list[int | None]) -> list[Method]:
    """One method per kind; tandem kinds get one method per K when several K are swept."""
    unknown = [kind for kind in kinds if kind not in METHOD_KINDS]
    if unknown:
        raise SettingsError(f"Unknown method {', '.join(unknown)}: choose from {', '.join(METHOD_KINDS)}.")
    if not kinds:
        raise SettingsError("--methods names no method.")
    methods: list[Method] = []
    for kind in dict.fromkeys(kinds):
        if kind in K_SWEPT_KINDS and len(k_values) > 1:
            methods += [Method(f"{kind}[k={'adaptive' if k is None else k}]", kind, k) for k in k_values]
        elif kind in K_SWEPT_KINDS:
            methods.append(Method(kind, kind, k_values[0]))
        else:
            methods.append(Method(kind, kind))
    return methods


class TandemRunner:
    """A method that goes through Tandem's own loop. Tandem methods share one ChatEngine (one calibration,
    one set of caches); each sets its own speculation settings and starts every question from empty caches."""

    def __init__(self, method: Method, engine, speculation):
        speculation.validate()
        self.method = method
        self.engine = engine
        self.speculation = speculation
        self.target_step_s = engine.calibrate()
        self.verify_forward_s: dict[int, float] = {}

    def start_prompt(self) -> None:
        """A new question starts from empty caches and an empty suffix index (another method's reply
        to the same question would be drafted whole); turns of one question reuse them, as in chat."""
        self.engine.reset()
        self.engine.forget_history()

    def run_turn(self, prompt_ids: list[int], tokenizer) -> TurnResult:
        first_token_at: list[float] = []

        def on_event(event) -> None:
            if not first_token_at and getattr(event, "spans", None):
                first_token_at.append(time.perf_counter())

        self.engine.speculation = self.speculation
        start = time.perf_counter()
        finished = self.engine.generate_ids(prompt_ids, on_event=on_event)
        elapsed = time.perf_counter() - start
        stats = finished.stats
        self.verify_forward_s = dict(stats.verify_forward_s or {})
        tally = Tally(calls=1, generated_tokens=len(finished.token_ids), time_s=elapsed)
        if first_token_at:
            tally.time_first_token(first_token_at[0] - start)
        tally.add(tally_from_stats(stats))
        token_ids = list(finished.token_ids)
        return TurnResult(token_ids, decode_answer(tokenizer, token_ids), tally)


class FirstTokenTimer:
    """A transformers streamer that notes when the first generated tokens arrive (the first put is the prompt)."""

    def __init__(self, start: float):
        self.start = start
        self.puts = 0
        self.first_token_s: float | None = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.start

    def end(self) -> None:
        pass


class RoundRecorder:
    """Counts drafted and accepted tokens of transformers' assisted generation.

    `generate` asks the model for its candidate generator; the instance attribute set here wraps that
    call, and wraps the generator's `update_candidate_strategy(input_ids, scores, num_matches)`, which
    is called once per round with scores over the candidates plus one.
    """

    def __init__(self, model):
        self.model = model
        self.tally = Tally()

    def __enter__(self) -> RoundRecorder:
        original = self.model._get_candidate_generator
        tally = self.tally

        def get_candidate_generator(*args, **kwargs):
            generator = original(*args, **kwargs)
            update = generator.update_candidate_strategy

            def update_candidate_strategy(input_ids, scores, num_matches):
                tally.record_round(int(scores.shape[1]) - 1, int(num_matches))
                return update(input_ids, scores, num_matches)

            generator.update_candidate_strategy = update_candidate_strategy
            return generator

        self.model._get_candidate_generator = get_candidate_generator
        return self

    def __exit__(self, *exc) -> None:
        del self.model._get_candidate_generator


@dataclass(frozen=True)
class HFSettings:
    """How the transformers baselines are configured (recorded in the report's config)."""

    assistant_tokens: int = 5  # hf-assisted: draft tokens in the first round
    assistant_schedule: str = (
        "heuristic"  # transformers' own adaptive rule: +2 after a full accept, -1 otherwise
    )
    assistant_confidence_threshold: float = 0.4  # transformers' default early stop for the draft
    lookup_tokens: int = 3  # hf-lookup: prompt_lookup_num_tokens
    lookup_ngram: int = 2  # hf-lookup: max_matching_ngram_size (transformers' default)

    def validate(self) -> None:
        if self.assistant_schedule not in ("heuristic", "heuristic_transient", "constant"):
            raise SettingsError(
                f"Unknown assisted-generation schedule '{self.assistant_schedule}': "
                "choose heuristic, heuristic_transient or constant."
            )
        if self.assistant_tokens < 1 or self.lookup_tokens < 1 or self.lookup_ngram < 1:
            raise SettingsError("transformers draft and lookup lengths must be at least 1.")


class HFRunner:
    """A method that calls transformers' `model.generate` on the same prompt ids."""

    def __init__(self, method: Method, target, draft, sampling, hf: HFSettings):
        if method.kind == "hf-assisted" and draft is None:
            raise SettingsError(
                "hf-assisted needs a draft model; --draft is ngram or none. Drop hf-assisted or choose a draft."
            )
        self.method = method
        self.model = target.model
        self.device = target.device
        self.assistant = draft.model if method.kind == "hf-assisted" else None
        self.sampling = sampling
        self.generation_config = hf_generation_config(method, target, sampling, hf)
        if self.assistant is not None:
            configure_assistant(self.assistant, hf)

    def start_prompt(self) -> None:
        pass

    def run_turn(self, prompt_ids: list[int], tokenizer) -> TurnResult:
        import torch

        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        kwargs = {"assistant_model": self.assistant} if self.assistant is not None else {}
        if self.sampling.seed is not None:
            torch.manual_seed(self.sampling.seed)
        with RoundRecorder(self.model) as recorder:
            start = time.perf_counter()
            timer = FirstTokenTimer(start)
            output = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=self.generation_config,
                streamer=timer,
                **kwargs,
            )
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            elapsed = time.perf_counter() - start
        token_ids = output[0, len(prompt_ids) :].tolist()
        tally = Tally(calls=1, generated_tokens=len(token_ids), time_s=elapsed)
        if timer.first_token_s is not None:
            tally.time_first_token(timer.first_token_s)
        if self.method.kind != "hf-plain":
            tally.add(recorder.tally)
        return TurnResult(token_ids, decode_answer(tokenizer, token_ids), tally)


def hf_generation_config(method: Method, target, sampling, hf: HFSettings):
    """A complete GenerationConfig, so nothing comes from the model's own defaults (such as top_k=50)."""
    from transformers import GenerationConfig

    eos = sorted(target.eos_token_ids)
    pad = target.tokenizer.pad_token_id
    options = dict(
        max_new_tokens=sampling.max_new_tokens,
        eos_token_id=eos,
        pad_token_id=pad if pad is not None else (eos[0] if eos else None),
        do_sample=not sampling.greedy,
    )
    if not sampling.greedy:
        options.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    if method.kind == "hf-lookup":
        options.update(prompt_lookup_num_tokens=hf.lookup_tokens, max_matching_ngram_size=hf.lookup_ngram)
    return GenerationConfig(**options)


def configure_assistant(assistant_model, hf: HFSettings) -> None:
    """transformers reads the draft length and schedule from the DRAFT's generation_config only."""
    config = assistant_model.generation_config
    config.num_assistant_tokens = hf.assistant_tokens
    config.num_assistant_tokens_schedule = hf.assistant_schedule
    config.assistant_confidence_threshold = hf.assistant_confidence_threshold


def decode_answer(tokenizer, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def build_runners(
    methods: list[Method],
    target,
    draft,
    draft_kind: str,
    sampling,
    hf: HFSettings,
    max_k: int = 8,
    compiled: str = "auto",
    head_source: str | None = None,
    trees: bool = True,
    head_vocab: int | None = None,
    progress=None,
):
    """draft_kind: 'model', 'ngram', 'head' or 'none', what --draft asked for; head_source: the folder
    of `--draft head:DIR` (None: the shipped head). With compiled "auto" a CPU target's compiled
    forward is built first where no earlier run built it (once per machine): the bench measures the
    runner the app switches to, not the eager one it serves with while that build runs."""
    from engine.settings import SpeculationSettings

    drafters = {
        "baseline": "none",
        "tandem": draft_kind,
        "tandem-ngram": "ngram",
        "tandem-suffix": "suffix",
        "tandem-head": "head",
        "tandem-auto": "auto",
    }
    engine = eager_engine = None
    runners = []
    for method in methods:
        if method.kind == "baseline-eager":
            from engine.session import ChatEngine

            if eager_engine is None:
                eager_engine = ChatEngine(target, None, sampling=sampling, compiled="off")
                eager_engine.prepare()
            runners.append(TandemRunner(method, eager_engine, SpeculationSettings(drafter="none")))
        elif method.kind in drafters:
            if engine is None:
                from engine.session import ChatEngine

                engine = ChatEngine(
                    target, draft if draft_kind == "model" else None, sampling=sampling, compiled=compiled
                )
                engine.head_source, engine.head_vocab = head_source, head_vocab
                if compiled == "auto":
                    engine.build_compiled(progress)
                engine.prepare(progress)
            speculation = SpeculationSettings(
                drafter=drafters[method.kind], k=method.k, max_k=max_k, trees=trees
            )
            runners.append(TandemRunner(method, engine, speculation))
        elif method.kind.startswith("llama-cpp"):
            from engine.bench.llama_cpp import LlamaCppRunner

            runners.append(LlamaCppRunner(method, target.spec, sampling))
        else:
            runners.append(HFRunner(method, target, draft, sampling, hf))
    return runners
