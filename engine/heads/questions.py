"""Questions and requests the target writes itself, in a user's voice, for the draft head's training.

Templates give the head many instructions of a few shapes; a head trained on them predicted the target
well on more of the same and much worse on other kinds of prompt (engine.heads.prompts). Asking the target to
write what a given person might ask, sampled, gives shapes no template has: role-play, opinions,
odd phrasings, multi-part requests. Nothing here comes from a public benchmark or from Tandem's
evaluation prompts.
"""

from __future__ import annotations

import random
from pathlib import Path

from engine.heads.passages import JOBS, NAMES, PRODUCTS, write_timed
from engine.heads.prompts import ACTIVITIES, LANGUAGES, TOPICS, distinct

ASKERS = (
    "a student",
    "a parent",
    "a programmer",
    "a small-business owner",
    "a retired teacher",
    "a nurse",
    "a traveller",
    "a gardener",
    "a teenager",
    "a cook",
    "a scientist",
    "a novelist",
    "a shop manager",
    "a musician",
    "a farmer",
    "a lawyer",
    "a football coach",
    "a new employee",
    "a pet owner",
    "a tourist",
)
CHARACTERS = (
    "a pirate captain",
    "a medieval knight",
    "a detective",
    "a wise old wizard",
    "a tour guide",
    "a friendly robot",
    "a grumpy chef",
    "a famous explorer",
    "a sports commentator",
    "a job interviewer",
    "a museum guide",
    "a ship's doctor",
    "a fairy-tale queen",
    "a space station engineer",
)
SUBJECTS = (*TOPICS, *ACTIVITIES, *PRODUCTS, *(f"working as a {job}" for job in JOBS))

QUESTION_REQUESTS = (
    lambda r: (
        f"Write one question that {r.choice(ASKERS)} might ask an AI assistant about {r.choice(SUBJECTS)}. Write only the question."
    ),
    lambda r: (
        f"Write one request that {r.choice(ASKERS)} might type into a chatbot to get help with {r.choice(ACTIVITIES)}. Write only the request."
    ),
    lambda r: (
        f"Write a message that asks an AI assistant to play {r.choice(CHARACTERS)} and to answer a question about {r.choice(SUBJECTS)} in character. Write only the message."
    ),
    lambda r: (
        f"Write a short question about {r.choice(TOPICS)} that has a clear factual answer. Write only the question."
    ),
    lambda r: (
        f"Write a request to a chatbot for a {r.choice(LANGUAGES)} program about {r.choice(SUBJECTS)}. Write only the request."
    ),
    lambda r: (
        f"Write a message from {r.choice(NAMES)} asking an AI assistant for advice on a problem with {r.choice(SUBJECTS)}. Write only the message."
    ),
)

SHORTEST, LONGEST = 15, 400


def question_requests(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """`count` distinct ("question", request) pairs in a fixed order for a seed."""
    rng = random.Random(seed + 4)
    return [("question", request) for request in distinct(lambda: rng.choice(QUESTION_REQUESTS)(rng), count)]


def tidy_question(text: str) -> str | None:
    """The first paragraph, unquoted; None if too short or too long to be a user's message."""
    text = text.strip().split("\n\n")[0].strip().strip('"').strip()
    for prefix in ("Question:", "Request:", "Message:"):
        text = text.removeprefix(prefix).strip()
    return text if SHORTEST <= len(text) <= LONGEST else None


def questions_asked(loaded, count: int, device, work: Path, seed: int = 0, batch: int = 32) -> list[str]:
    """`count` user messages the target writes (a third more are asked for: some are dropped)."""
    requests = question_requests(-(-count * 4 // 3), seed)
    written = write_timed(
        loaded,
        requests,
        device,
        work,
        batch,
        "target writes questions",
        "questions_s",
        tokens=80,
        name="questions",
        keep=tidy_question,
    )
    return list(dict.fromkeys(text for _, text in written))[:count]
