"""`tandem-cli bench`: Tandem's speculative loop against the target alone and against transformers' own
assisted generation, on MT-Bench / Spec-Bench style prompt files.

Definitions used in every report:
- A generation call is timed from the moment its prompt ids are ready (chat template applied and
  tokenized) until its last token is out; prefill is included.
- tokens_per_s = generated tokens (end token included) / summed call time, over all turns of all
  prompts in the group. Speed-ups are ratios of these tokens/s values.
- ttft_s = mean time from the start of a call to its first generated token.
- acceptance_rate = accepted draft tokens / drafted tokens; mean_accepted_length = tokens emitted
  per target verification round (accepted drafts plus the target's own token). Null for methods that
  never draft.
- greedy_identical (temperature 0 only) = fraction of prompts whose generated tokens, every turn,
  equal the `baseline` method's exactly.

Methods run one after another on each prompt, in an order rotated from prompt to prompt, so that
machine noise and cache warmth hit them alike; models are loaded once and shared.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import PromptFileError, SettingsError

DEFAULT_PROMPTS_NAME = "tandem-bench.jsonl"
METHOD_KINDS = ("baseline", "tandem", "tandem-ngram", "hf-assisted", "hf-lookup", "hf-plain")
K_SWEPT_KINDS = ("tandem", "tandem-ngram")
HF_KINDS = ("hf-assisted", "hf-lookup", "hf-plain")
SUMMARY_FIELDS = (
    "tokens_per_s",
    "speedup_vs_baseline",
    "speedup_vs_hf_plain",
    "acceptance_rate",
    "mean_accepted_length",
    "greedy_identical",
    "ttft_s",
)


# ---- prompt files ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchPrompt:
    question_id: int | str
    category: str
    turns: tuple[str, ...]


def default_prompts_path() -> Path:
    """resources/prompts/tandem-bench.jsonl, found through the package path."""
    import resources

    for folder in resources.__path__:
        path = Path(folder) / "prompts" / DEFAULT_PROMPTS_NAME
        if path.is_file():
            return path
    raise PromptFileError(f"The built-in prompt set resources/prompts/{DEFAULT_PROMPTS_NAME} is missing.")


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise PromptFileError(f"No prompt file at '{path}'.") from None
    except (OSError, UnicodeDecodeError) as error:
        raise PromptFileError(f"Cannot read prompt file '{path}': {error}") from None
    prompts = [parse_prompt_line(line, number, path) for number, line in enumerate(lines, 1) if line.strip()]
    check_unique_ids(prompts, lines, path)
    if not prompts:
        raise PromptFileError(f"{path} holds no prompts.")
    return prompts


def parse_prompt_line(line: str, number: int, path: str | Path = "<prompts>") -> BenchPrompt:
    """One MT-Bench / Spec-Bench question: {"question_id", "category", "turns": [user messages]}."""

    def refuse(why: str) -> PromptFileError:
        return PromptFileError(f"{path}, line {number}: {why}")

    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise refuse(f"not valid JSON ({error.msg} at column {error.colno}).") from None
    if not isinstance(data, dict):
        raise refuse("expected a JSON object with question_id, category and turns.")
    missing = [key for key in ("question_id", "category", "turns") if key not in data]
    if missing:
        raise refuse(f"missing {', '.join(missing)}.")
    question_id, category, turns = data["question_id"], data["category"], data["turns"]
    if isinstance(question_id, bool) or not isinstance(question_id, (int, str)) or question_id == "":
        raise refuse("question_id must be an integer or a non-empty string.")
    if not isinstance(category, str) or not category.strip():
        raise refuse("category must be a non-empty string.")
    if not isinstance(turns, list) or not turns:
        raise refuse("turns must be a non-empty list of user messages.")
    if not all(isinstance(turn, str) and turn.strip() for turn in turns):
        raise refuse("every turn must be a non-empty string.")
    return BenchPrompt(question_id, category.strip(), tuple(turns))


def check_unique_ids(prompts: list[BenchPrompt], lines: list[str], path: Path) -> None:
    numbers = [number for number, line in enumerate(lines, 1) if line.strip()]
    seen: dict = {}
    for prompt, number in zip(prompts, numbers, strict=True):
        if prompt.question_id in seen:
            raise PromptFileError(
                f"{path}, line {number}: question_id {prompt.question_id!r} already used on line "
                f"{seen[prompt.question_id]}."
            )
        seen[prompt.question_id] = number


def select_prompts(
    prompts: list[BenchPrompt], categories: list[str] | None = None, limit: int | None = None
) -> list[BenchPrompt]:
    """Keeps the given categories; `limit` takes prompts from each category in turn, so a small
    sample still spans the categories."""
    if categories:
        known = {p.category for p in prompts}
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise SettingsError(
                f"No prompts in categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"the file has {', '.join(sorted(known))}."
            )
        prompts = [p for p in prompts if p.category in categories]
    if limit is None or limit >= len(prompts):
        return list(prompts)
    if limit < 1:
        raise SettingsError(f"--limit must be at least 1, not {limit}.")
    by_category: dict[str, list[BenchPrompt]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    chosen: list[BenchPrompt] = []
    for rank in range(max(len(group) for group in by_category.values())):
        for group in by_category.values():
            if rank < len(group) and len(chosen) < limit:
                chosen.append(group[rank])
    return chosen


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The same ids Tandem's chat feeds the model: the tokenizer's chat template, generation prompt added."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages) + "Assistant:"
    return list(tokenizer(text, add_special_tokens=False).input_ids)


# ---- methods -----------------------------------------------------------------------------------


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


# ---- what one generation call measured ---------------------------------------------------------


@dataclass
class Tally:
    """Additive counters for one call, or summed over turns, prompts, categories."""

    calls: int = 0
    generated_tokens: int = 0
    time_s: float = 0.0
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    round_tokens: int = 0
    draft_time_s: float = 0.0
    # per draft position: how often it was reached (every earlier draft token accepted) and accepted
    position_reached: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    k_counts: Counter = field(default_factory=Counter)

    def add(self, other: Tally) -> Tally:
        self.calls += other.calls
        self.generated_tokens += other.generated_tokens
        self.time_s += other.time_s
        self.ttft_sum_s += other.ttft_sum_s
        self.ttft_count += other.ttft_count
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.rounds += other.rounds
        self.round_tokens += other.round_tokens
        self.draft_time_s += other.draft_time_s
        self.position_reached = add_lists(self.position_reached, other.position_reached)
        self.position_accepted = add_lists(self.position_accepted, other.position_accepted)
        self.k_counts.update(other.k_counts)
        return self

    def record_round(self, drafted: int, accepted: int) -> None:
        """One verification round: `drafted` proposed, the first `accepted` of them kept."""
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.round_tokens += accepted + 1
        self.k_counts[drafted] += 1
        reached = min(drafted, accepted + 1)
        self.position_reached = add_lists(self.position_reached, [1] * reached)
        self.position_accepted = add_lists(self.position_accepted, [1] * accepted)

    @property
    def tokens_per_s(self) -> float | None:
        return self.generated_tokens / self.time_s if self.time_s > 0 else None

    @property
    def ttft_s(self) -> float | None:
        return self.ttft_sum_s / self.ttft_count if self.ttft_count else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        return self.round_tokens / self.rounds if self.rounds and self.drafted else None

    @property
    def alpha(self) -> float | None:
        """Per-token acceptance probability, as the E(K) formula means it: accepted / positions reached."""
        reached = sum(self.position_reached)
        return sum(self.position_accepted) / reached if reached else None

    @property
    def mean_k(self) -> float | None:
        """Mean draft length per round; None for a method that never drafted."""
        total = sum(self.k_counts.values())
        if not total or not self.drafted:
            return None
        return sum(k * n for k, n in self.k_counts.items()) / total

    @property
    def draft_step_s(self) -> float | None:
        return self.draft_time_s / self.drafted if self.drafted and self.draft_time_s > 0 else None


def add_lists(a: list[int], b: list[int]) -> list[int]:
    longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
    return [x + (shorter[i] if i < len(shorter) else 0) for i, x in enumerate(longer)]


@dataclass
class TurnResult:
    token_ids: list[int]
    text: str
    tally: Tally


@dataclass
class PromptRecord:
    """One prompt answered by one method: every turn."""

    question_id: int | str
    category: str
    method: str
    token_ids: list[list[int]] = field(default_factory=list)  # per turn
    tally: Tally = field(default_factory=Tally)


# ---- runners -----------------------------------------------------------------------------------


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
        """A new question starts from empty caches; turns of one question reuse them, as in chat."""
        self.engine.reset()

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
            tally.ttft_sum_s, tally.ttft_count = first_token_at[0] - start, 1
        tally.add(tally_from_stats(stats))
        token_ids = list(finished.token_ids)
        return TurnResult(token_ids, decode_answer(tokenizer, token_ids), tally)


def tally_from_stats(stats) -> Tally:
    """Round counters from the engine's GenerationStats."""
    reached = [
        min(drafted, accepted_before)
        for drafted, accepted_before in zip(
            stats.per_position_drafted,
            [stats.rounds] + list(stats.per_position_accepted[:-1]),
            strict=False,
        )
    ]
    return Tally(
        drafted=stats.drafted,
        accepted=stats.accepted,
        rounds=stats.rounds,
        round_tokens=sum(stats.accepted_lengths),
        draft_time_s=stats.draft_time_s,
        position_reached=reached,
        position_accepted=list(stats.per_position_accepted),
        k_counts=Counter(stats.k_history),
    )


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
            tally.ttft_sum_s, tally.ttft_count = timer.first_token_s, 1
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
    methods: list[Method], target, draft, draft_kind: str, sampling, hf: HFSettings, max_k: int = 8,
    compiled: str = "auto",
):  # fmt: skip
    """draft_kind: 'model', 'ngram' or 'none', what --draft asked for."""
    from engine.settings import SpeculationSettings

    drafters = {"baseline": "none", "tandem": draft_kind, "tandem-ngram": "ngram"}
    engine = None
    runners = []
    for method in methods:
        if method.kind in drafters:
            if engine is None:
                from engine.session import ChatEngine

                engine = ChatEngine(
                    target, draft if draft_kind == "model" else None, sampling=sampling, compiled=compiled
                )
                engine.prepare()
            speculation = SpeculationSettings(drafter=drafters[method.kind], k=method.k, max_k=max_k)
            runners.append(TandemRunner(method, engine, speculation))
        else:
            runners.append(HFRunner(method, target, draft, sampling, hf))
    return runners


# ---- the benchmark loop ------------------------------------------------------------------------


def run_conversation(runner, prompt: BenchPrompt, tokenizer, system: str | None = None) -> PromptRecord:
    """Plays every turn of `prompt`, with the method's own answers between the user turns."""
    record = PromptRecord(prompt.question_id, prompt.category, runner.method.name)
    messages = [{"role": "system", "content": system}] if system else []
    runner.start_prompt()
    for turn in prompt.turns:
        messages.append({"role": "user", "content": turn})
        result = runner.run_turn(chat_prompt_ids(tokenizer, messages), tokenizer)
        messages.append({"role": "assistant", "content": result.text})
        record.token_ids.append(result.token_ids)
        record.tally.add(result.tally)
    return record


def rotated(items: list, shift: int) -> list:
    shift %= max(len(items), 1)
    return items[shift:] + items[:shift]


def warm_up(runners, prompt: BenchPrompt, tokenizer, rounds: int, on_step=None) -> None:
    """Untimed passes of the first turn of `prompt` through every method."""
    single_turn = BenchPrompt(prompt.question_id, prompt.category, prompt.turns[:1])
    for _ in range(rounds):
        for runner in runners:
            run_conversation(runner, single_turn, tokenizer)
            if on_step:
                on_step(runner.method.name)


def run_benchmark(runners, prompts: list[BenchPrompt], tokenizer, on_step=None) -> list[PromptRecord]:
    """Every prompt through every method, the method order rotated per prompt."""
    records = []
    for index, prompt in enumerate(prompts):
        for runner in rotated(list(runners), index):
            records.append(run_conversation(runner, prompt, tokenizer))
            if on_step:
                on_step(runner.method.name)
    return records


# ---- aggregation -------------------------------------------------------------------------------


def identical_fraction(records: list[PromptRecord], baseline: dict) -> float | None:
    """Share of `records` whose tokens equal baseline's (question_id -> per-turn tokens) exactly."""
    pairs = [(r, baseline.get(r.question_id)) for r in records]
    pairs = [(r, b) for r, b in pairs if b is not None]
    if not pairs:
        return None
    return sum(r.token_ids == b for r, b in pairs) / len(pairs)


def summarize(tally: Tally, reference_tps: dict[str, float | None], identical: float | None) -> dict:
    tps = tally.tokens_per_s
    return {
        "tokens_per_s": tps,
        "speedup_vs_baseline": ratio(tps, reference_tps.get("baseline")),
        "speedup_vs_hf_plain": ratio(tps, reference_tps.get("hf-plain")),
        "acceptance_rate": tally.acceptance_rate,
        "mean_accepted_length": tally.mean_accepted_length,
        "greedy_identical": identical,
        "ttft_s": tally.ttft_s,
        "generated_tokens": tally.generated_tokens,
        "time_s": tally.time_s,
        "calls": tally.calls,
        "alpha": tally.alpha,
        "mean_k": tally.mean_k,
        "k_distribution": {str(k): n for k, n in sorted(tally.k_counts.items())},
        "draft_step_s": tally.draft_step_s,
    }


def ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def sum_tallies(records: list[PromptRecord]) -> Tally:
    total = Tally()
    for record in records:
        total.add(record.tally)
    return total


def reference_speeds(records: list[PromptRecord], methods: list[Method]) -> dict[str, float | None]:
    """tokens/s of the reference methods (by kind: baseline, hf-plain) over `records`."""
    speeds: dict[str, float | None] = {}
    for method in methods:
        if method.kind in ("baseline", "hf-plain"):
            speeds[method.kind] = sum_tallies([r for r in records if r.method == method.name]).tokens_per_s
    return speeds


def aggregate(
    records: list[PromptRecord],
    methods: list[Method],
    greedy: bool,
    extras: dict[str, dict] | None = None,
) -> dict:
    """The report's "methods" and "prompts" sections from per-prompt records."""
    baseline = next((m.name for m in methods if m.kind == "baseline"), None)
    baseline_tokens = (
        {r.question_id: r.token_ids for r in records if r.method == baseline} if greedy and baseline else {}
    )
    categories = list(dict.fromkeys(r.category for r in records))
    overall_refs = reference_speeds(records, methods)
    category_refs = {
        c: reference_speeds([r for r in records if r.category == c], methods) for c in categories
    }
    check_identity = bool(baseline_tokens)

    methods_section = {}
    for method in methods:
        own = [r for r in records if r.method == method.name]
        summary = {"kind": method.kind, "k": method.k_label}
        summary.update(
            summarize(sum_tallies(own), overall_refs, identity(own, baseline_tokens, check_identity))
        )
        summary.update((extras or {}).get(method.name, {}))
        summary["by_category"] = {
            category: summarize(
                sum_tallies(in_category := [r for r in own if r.category == category]),
                category_refs[category],
                identity(in_category, baseline_tokens, check_identity),
            )
            for category in categories
        }
        methods_section[method.name] = summary

    prompts_section = []
    for question_id in dict.fromkeys(r.question_id for r in records):
        own = {r.method: r for r in records if r.question_id == question_id}
        first = next(iter(own.values()))
        refs = reference_speeds(list(own.values()), methods)
        prompts_section.append(
            {
                "question_id": question_id,
                "category": first.category,
                "turns": len(first.token_ids),
                "methods": {
                    name: summarize(record.tally, refs, identity([record], baseline_tokens, check_identity))
                    for name, record in own.items()
                },
            }
        )
    return {"methods": methods_section, "prompts": prompts_section}


def identity(records: list[PromptRecord], baseline_tokens: dict, enabled: bool) -> float | None:
    return identical_fraction(records, baseline_tokens) if enabled else None


def build_report(
    config: dict, records: list[PromptRecord], methods: list[Method], greedy: bool, extras=None
) -> dict:
    report = {"config": config}
    report.update(aggregate(records, methods, greedy, extras))
    return report


def write_report(report: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
    temporary.replace(path)
    return path


# ---- the terminal table ------------------------------------------------------------------------


def format_table(report: dict) -> str:
    """Per method: speed, speed-ups, acceptance, TTFT, identity; then speed-up vs baseline per category."""
    methods = report["methods"]
    header = [
        "method",
        "tok/s",
        "vs base",
        "vs hf-plain",
        "accept",
        "mean len",
        "TTFT ms",
        "identical",
        "K dist",
    ]
    rows = [
        [
            name,
            fmt(m["tokens_per_s"], "{:.2f}"),
            fmt(m["speedup_vs_baseline"], "{:.2f}x"),
            fmt(m["speedup_vs_hf_plain"], "{:.2f}x"),
            fmt(m["acceptance_rate"], "{:.0%}"),
            fmt(m["mean_accepted_length"], "{:.2f}"),
            fmt(m["ttft_s"] * 1000 if m["ttft_s"] is not None else None, "{:.0f}"),
            fmt(m["greedy_identical"], "{:.0%}"),
            format_k_distribution(m.get("k_distribution") or {}),
        ]
        for name, m in methods.items()
    ]
    lines = [render_rows(header, rows)]
    categories = list(next(iter(methods.values()))["by_category"]) if methods else []
    if categories and any(m["speedup_vs_baseline"] is not None for m in methods.values()):
        cat_header = ["speed-up vs baseline"] + categories
        cat_rows = [
            [name] + [fmt(m["by_category"][c]["speedup_vs_baseline"], "{:.2f}x") for c in categories]
            for name, m in methods.items()
        ]
        lines += ["", render_rows(cat_header, cat_rows)]
    return "\n".join(lines)


def format_k_distribution(distribution: dict[str, int], top: int = 3) -> str:
    total = sum(distribution.values())
    if not total or set(distribution) == {"0"}:
        return "-"
    common = sorted(distribution.items(), key=lambda item: -item[1])[:top]
    return " ".join(f"{k}:{n / total:.0%}" for k, n in common)


def fmt(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def render_rows(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]

    def line(cells):
        return "  ".join(
            str(cell).ljust(width) if i == 0 else str(cell).rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(row) for row in rows])
