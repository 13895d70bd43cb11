"""Benchmark prompt files: one JSON object per line, chosen per category."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.errors import PromptFileError, SettingsError

DEFAULT_PROMPTS_NAME = "tandem-bench.jsonl"


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
    prompts: list[BenchPrompt],
    categories: list[str] | None = None,
    limit: int | None = None,
    min_turns: int = 1,
) -> list[BenchPrompt]:
    """Keeps the given categories and the questions of at least `min_turns` user turns; `limit` takes
    prompts from each category in turn, so a small sample still spans the categories."""
    if min_turns < 1:
        raise SettingsError(f"--min-turns must be at least 1, not {min_turns}.")
    if categories:
        known = {p.category for p in prompts}
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise SettingsError(
                f"No prompts in categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"the file has {', '.join(sorted(known))}."
            )
        prompts = [p for p in prompts if p.category in categories]
    if min_turns > 1:
        longest = max((len(p.turns) for p in prompts), default=0)
        if longest < min_turns:
            raise SettingsError(f"No question has {min_turns} turns; the longest has {longest}.")
        prompts = [p for p in prompts if len(p.turns) >= min_turns]
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
