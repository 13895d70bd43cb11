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

With repeats > 1 every prompt runs that many interleaved passes of all methods (each in its own
rotation), and each method keeps its fastest pass of the prompt. A busy machine only ever adds time,
so the fastest of a few passes is the least noisy figure for one prompt, and every method is judged
alike.
"""

from __future__ import annotations

from engine.bench.prompts import (
    BenchPrompt,
)
from engine.bench.records import PromptRecord
from engine.models.chat_template import chat_prompt_ids


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


def run_benchmark(
    runners, prompts: list[BenchPrompt], tokenizer, on_step=None, repeats: int = 1
) -> list[PromptRecord]:
    """Every prompt through every method, the method order rotated per pass; with repeats, each
    method's fastest pass of each prompt."""
    records = []
    passes = 0
    for prompt in prompts:
        fastest: dict[int, PromptRecord] = {}  # runner's index -> its fastest pass
        for _ in range(repeats):
            for index, runner in rotated(list(enumerate(runners)), passes):
                record = run_conversation(runner, prompt, tokenizer)
                if index not in fastest or record.tally.time_s < fastest[index].tally.time_s:
                    fastest[index] = record
                if on_step:
                    on_step(runner.method.name)
            passes += 1
        records.extend(fastest[index] for index in sorted(fastest))
    return records
