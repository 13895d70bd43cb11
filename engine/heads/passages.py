"""Texts the target writes itself, for the draft head's training instructions that work on a pasted text.

People paste emails, notes, reviews, reports and adverts into a chat and ask for a summary, the facts
in them, an answer from them or a translation. The standard library's docstrings (engine.heads.prompts) are
all technical prose; a head trained on them alone kept 0.21-0.23 top-1 on such tasks against 0.36-0.43
on explanations, code and arithmetic. So the target first writes short everyday texts from the
requests below (sampled, batched), then instructions are built over them. Nothing here comes from a
public benchmark or from Tandem's evaluation prompts.

Measured once: the shipped head trained further on 480 prompts, half of them over 140 written texts
(`--init-from`, `--written-share 0.5`, 3 epochs), moved teacher-forced top-1 on Tandem's bench prompts
from 0.295 to 0.299 (summarization 0.21 -> 0.24, extraction 0.23 -> 0.27, rag 0.23 -> 0.22, code 0.36
-> 0.34): too little to ship, so `--written-share` is off by default.
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import torch

from engine.heads.prompts import ACTIVITIES, TOPICS, TRANSLATION_LANGUAGES, distinct

NAMES = (
    "Amara",
    "Bruno",
    "Chen Wei",
    "Dana",
    "Elif",
    "Farid",
    "Greta",
    "Hiro",
    "Ines",
    "Jamal",
    "Katya",
    "Luis",
    "Maren",
    "Nikhil",
    "Olu",
    "Paula",
    "Quentin",
    "Rosa",
    "Sven",
    "Tamsin",
    "Umar",
    "Vera",
)
TOWNS = ("Ashby", "Brennock", "Calderwick", "Dunmore", "Eastvale", "Fairholm", "Glenrow", "Harlow Bay")
PRODUCTS = (
    "a pair of running shoes",
    "a coffee grinder",
    "a budget laptop",
    "a robot vacuum",
    "a tent",
    "a pair of headphones",
    "an electric kettle",
    "a standing desk",
    "a phone case",
    "a blender",
)
JOBS = ("delivery driver", "junior accountant", "nurse", "barista", "web developer", "teacher", "electrician")
EVENTS = (
    "an office move",
    "a new holiday policy",
    "a charity run",
    "a software release",
    "a team lunch",
    "a change to the opening hours",
    "a building inspection",
    "a training day",
    "a price increase",
)

# (kind of text, request to the target)
WRITING_REQUESTS = (
    lambda r: (
        "news report",
        f"Write a short local news report about {r.choice(TOPICS)} in the town of {r.choice(TOWNS)}.",
    ),
    lambda r: (
        "email",
        f"Write an email from {r.choice(NAMES)} to their team about {r.choice(EVENTS)}, with dates.",
    ),
    lambda r: (
        "customer review",
        f"Write a customer review of {r.choice(PRODUCTS)}: what was good and what was bad.",
    ),
    lambda r: (
        "meeting note",
        f"Write notes from a team meeting about {r.choice(EVENTS)}, naming who said what and what was decided.",
    ),
    lambda r: (
        "job advert",
        f"Write a job advert for a {r.choice(JOBS)} in {r.choice(TOWNS)}, with the pay and how to apply.",
    ),
    lambda r: ("story", f"Write a short story about {r.choice(NAMES)}, who is {r.choice(ACTIVITIES)}."),
    lambda r: (
        "announcement",
        f"Write an announcement about {r.choice(EVENTS)} in {r.choice(TOWNS)}, with the date and place.",
    ),
    lambda r: ("article", f"Write a paragraph for a magazine about {r.choice(TOPICS)}."),
    lambda r: (
        "message",
        f"Write a message from {r.choice(NAMES)} to a friend about {r.choice(ACTIVITIES)}.",
    ),
    lambda r: (
        "product description",
        f"Write a product description of {r.choice(PRODUCTS)} with its price and features.",
    ),
)

# Instructions over a written text: {text}, {kind}, {language}, {count}, {opening}
TASKS_ON_WRITTEN = (
    "Summarize the following text in {count} sentences.\n\n{text}",
    "Give a one-paragraph summary of this {kind}.\n\n{text}",
    "{text}\n\nSummarize the {kind} above in {count} bullet points.",
    "Read the {kind} and write a headline and a one-sentence summary.\n\n{text}",
    "Extract every name, place, date and number mentioned in the text below. Answer as a JSON list.\n\n{text}",
    "List the key facts of this {kind} as a table with two columns.\n\n{text}",
    "Answer using only the text below: who is involved, and what do they do?\n\n{text}",
    "Based only on this {kind}, what is the main problem and what is proposed? If the text does not say, say so.\n\n{text}",
    "What is the tone of this {kind}? Give examples from the text.\n\n{text}",
    "Rewrite this {kind} in a more formal tone.\n\n{text}",
    "Write a short reply to this {kind}.\n\n{text}",
    "Turn this {kind} into a to-do list.\n\n{text}",
    'Translate into {language}: "{opening}"',
    "{text}\n\nWhat are three questions a reader might ask after reading this, with their answers from the text?",
)

MIN_CHARS = 200


def writing_requests(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """`count` distinct (kind, request) pairs in a fixed order for a seed."""
    rng = random.Random(seed + 2)
    return distinct(lambda: rng.choice(WRITING_REQUESTS)(rng), count)


def tidy(text: str) -> str | None:
    """The written text cut after its last full sentence; None if too short to work on."""
    text = text.strip()
    end = max(
        text.rfind(". "),
        text.rfind(".\n"),
        text.rfind("!"),
        text.rfind("?"),
        text.rfind(".") if text.endswith(".") else -1,
    )
    text = text[: end + 1].strip() if end > 0 else text
    return text if len(text) >= MIN_CHARS else None


def tasks_on_written(passages: list[tuple[str, str]], per_passage: int, seed: int = 0) -> list[str]:
    """`per_passage` distinct instructions over each (kind, text)."""
    rng = random.Random(seed + 3)
    out: list[str] = []
    for kind, text in passages:
        sentences = re.split(r"(?<=[.!?])\s+", text)
        opening = " ".join(sentences[:2])
        for task in rng.sample(TASKS_ON_WRITTEN, per_passage):
            out.append(
                task.format(
                    text=text,
                    kind=kind,
                    count=rng.choice((2, 3)),
                    opening=opening,
                    language=rng.choice(TRANSLATION_LANGUAGES),
                )
            )
    return out


@torch.inference_mode()
def write_passages(
    loaded,
    requests: list[tuple[str, str]],
    device,
    work: Path,
    batch: int = 32,
    tokens: int = 180,
    progress=None,
    name: str = "passages",
    keep=tidy,
) -> list[tuple[str, str]]:
    """The target writes a text for each request (sampled at T = 0.8, batched); kept in work/<name>.json
    so an interrupted run resumes. Returns (kind, keep(text)) for the texts `keep` does not drop (None)."""
    from engine.heads.training import left_padded
    from engine.models.chat_template import chat_prompt_ids

    path = work / f"{name}.json"
    # [{"request", "text"}]: a run with other requests keeps only the texts written for its own
    stored = json.loads(path.read_text()) if path.exists() else []
    written: list[str] = []
    for entry, (_, request) in zip(stored, requests, strict=False):
        if entry["request"] != request:
            break
        written.append(entry["text"])
    model, tokenizer = loaded.model, loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(len(written))
    try:
        while len(written) < len(requests):
            chunk = requests[len(written) : len(written) + batch]
            prompts = [chat_prompt_ids(tokenizer, [{"role": "user", "content": r}]) for _, r in chunk]
            ids, mask = left_padded(prompts, pad)
            width = ids.size(1)
            generated = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=tokens,
                do_sample=True,
                temperature=0.8,
                top_p=0.95,
                top_k=None,
                pad_token_id=pad,
                eos_token_id=sorted(loaded.eos_token_ids),
            )[:, width:]
            written += tokenizer.batch_decode(generated, skip_special_tokens=True)
            entries = [{"request": r, "text": t} for (_, r), t in zip(requests, written, strict=False)]
            path.write_text(json.dumps(entries, indent=0))
            if progress is not None:
                progress(len(chunk))
    finally:
        torch.random.set_rng_state(generator_state)
    kept = [(kind, keep(text)) for (kind, _), text in zip(requests, written, strict=True)]
    return [(kind, text) for kind, text in kept if text]


def write_timed(loaded, requests, device, work: Path, batch: int, desc: str, cost_part: str, **options):
    """write_passages with a progress bar; its first run's time is kept in work/cost.json under
    `cost_part` (engine.heads.training adds the stages up)."""
    from tqdm.auto import tqdm

    work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with tqdm(total=len(requests), desc=desc, unit="it", dynamic_ncols=True) as bar:
        written = write_passages(loaded, requests, device, work, batch, progress=bar.update, **options)
    path = work / "cost.json"
    cost = json.loads(path.read_text()) if path.exists() else {}
    cost.setdefault(cost_part, time.perf_counter() - began)
    path.write_text(json.dumps(cost, indent=1))
    return written
