"""What the engine streams to its consumer (the GUI's thread bridge, the CLI, the benchmark).

Every event is an immutable dataclass. A consumer receives them through a plain callback
`on_event(event)`, called on the engine's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from engine.stats import GenerationStats

# progress(stage, done, total) of a long job (a load, a build, a download): stage is a short human
# label, done/total are step counts. Called on the thread doing the job.
ProgressCallback = Callable[[str, int, int], None]

# How a generated token came to be:
#   "draft"  - proposed by the drafter and accepted by the target;
#   "target" - chosen by the target: a correction at the first rejected position, or plain decoding;
#   "bonus"  - the target's extra token after every drafted token was accepted.
Provenance = Literal["draft", "target", "bonus"]
# "interrupted": a server's reply stream broke off mid-reply; the text so far is kept.
FinishReason = Literal["eos", "stop", "max_tokens", "cancelled", "error", "interrupted"]


@dataclass(frozen=True)
class TokenSpan:
    """The text one token completed (possibly empty, when it ends inside a multi-byte character)."""

    token_id: int
    text: str
    provenance: Provenance


@dataclass(frozen=True)
class TextPiece:
    spans: tuple[TokenSpan, ...]

    @property
    def text(self) -> str:
        return "".join(span.text for span in self.spans)


@dataclass(frozen=True)
class RoundStats:
    """Sent after every speculative round (or plain step)."""

    stats: GenerationStats


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    text: str
    token_ids: tuple[int, ...]
    stats: GenerationStats


@dataclass(frozen=True)
class Failed:
    message: str  # for the user
    details: str = ""  # traceback or technical detail, shown on demand


@dataclass(frozen=True)
class Progress:
    """Long preparation steps: converting a model, downloading, compiling."""

    stage: str
    done: int
    total: int


@dataclass(frozen=True)
class PrefillProgress:
    """Sent while a long prompt is read, before its reply's first token: once before the first chunk
    (`seconds_left` None: nothing measured yet), then after each chunk, the last with read == total.
    `read` and `total` count the prompt tokens this reply computes (those an earlier turn left in the
    cache are not read again); `prompt_tokens` is the whole prompt, what the context holds once read.
    `seconds_left` is estimated from the speed of the chunks read so far."""

    read: int
    total: int
    seconds_left: float | None
    prompt_tokens: int

    def summary(self) -> str:
        """e.g. "1,536 of 6,129 tokens · about 40 s left": the words every view shows it with."""
        text = f"{self.read:,} of {self.total:,} tokens"
        left = self.seconds_left
        if left is None or self.read >= self.total:
            return text
        if left < 60:
            return f"{text} · about {max(1, round(left))} s left"
        return f"{text} · about {round(left / 60)} min left"


Event = TextPiece | RoundStats | Finished | Failed | Progress | PrefillProgress
