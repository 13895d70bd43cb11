"""Conversation titles: the first message cut to a line at once, then a title the model writes from the
first exchange (as LM Studio, Jan and GPT4All name chats), where the user has not renamed it meanwhile.

The model is asked on the engine thread (EngineWorker.name_conversation) with the conversation as it
is plus one instruction, so the engine's cache of the conversation is reused and the title costs a short
prefill and a few tokens. Pure functions here, no Qt.
"""

from __future__ import annotations

import dataclasses
import re

TITLE_LENGTH = 48
TITLE_TOKENS = 24
TITLE_INSTRUCTION = (
    "Write a title for this conversation in at most six words. Answer with the title alone, "
    "without quotes or a full stop."
)
_PREFIXES = ("title:", "conversation title:", "topic:")
_PREAMBLE = re.compile(r"(here(’s|'s| is)|sure|certainly|okay|of course)\b", re.IGNORECASE)


def first_message_title(text: str) -> str:
    """A new conversation's title: its first message on one line, cut at a word with an ellipsis."""
    line = " ".join(text.split())
    if len(line) <= TITLE_LENGTH:
        return line
    cut = line[: TITLE_LENGTH - 1]
    if " " in cut[TITLE_LENGTH // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,.;:") + "…"


def title_messages(history: list[dict]) -> list[dict]:
    """The conversation so far, then the request for a title."""
    return [*history, {"role": "user", "content": TITLE_INSTRUCTION}]


def title_sampling(sampling):
    """Greedy and short: a title repeats, and costs a few tokens (a small model may open with a line
    such as "Here is a title:", so one line is not enough)."""
    return dataclasses.replace(
        sampling, temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=TITLE_TOKENS, seed=None, stop=()
    )


def clean_title(text: str) -> str:
    """The model's answer as a title: its first line that is not a preamble ("Here's a title:"),
    without a "Title:" label, quotes, Markdown or a full stop, cut like a first message; '' when
    nothing usable is left."""
    for line in (part.strip() for part in text.splitlines()):
        if line.lower().startswith(_PREFIXES):
            line = line.split(":", 1)[1].strip()
        if _PREAMBLE.match(line) or line.endswith(":"):
            continue
        line = line.strip("*#_`\"'“”‘’ ").rstrip(".!:;,").strip()
        if any(char.isalnum() for char in line):
            return first_message_title(line)
    return ""
