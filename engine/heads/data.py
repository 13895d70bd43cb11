"""The prompts a draft head trains on, in the recipe's shares: generated instructions (engine.heads.prompts),
questions the target asks in a user's voice (engine.heads.questions), and work on texts it writes first
(engine.heads.passages)."""

from __future__ import annotations

from pathlib import Path

from engine.heads.passages import tasks_on_written, write_timed, writing_requests
from engine.heads.prompts import training_instructions
from engine.heads.questions import questions_asked


def training_prompts(loaded, recipe, device, work: Path) -> list[list[int]]:
    """Chat-formatted prompt ids for `recipe.prompts` instructions: the generated ones of engine.heads.prompts,
    then a `recipe.asked_share` of them that the target asks, then a `recipe.written_share` over texts
    the target writes first."""
    from engine.models.chat_template import chat_prompt_ids

    written = round(recipe.prompts * recipe.written_share)
    asked = round(recipe.prompts * recipe.asked_share)
    instructions = training_instructions(max(recipe.prompts - written - asked, 0), recipe.seed)
    if asked:
        instructions += questions_asked(loaded, asked, device, work, recipe.seed, batch=recipe.generate_batch)
    if written:
        per_text = 2
        # a quarter more texts than needed: the ones too short to work on are dropped
        requests = writing_requests(-(-written * 5 // (4 * per_text)), recipe.seed)
        passages = write_timed(
            loaded, requests, device, work, recipe.generate_batch, "target writes texts", "texts_s"
        )
        instructions += tasks_on_written(passages, per_text, recipe.seed)[:written]
    return [chat_prompt_ids(loaded.tokenizer, [{"role": "user", "content": text}]) for text in instructions]
