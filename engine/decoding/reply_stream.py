"""A reply as it streams: the tokens the loop keeps, turned into text and events.

The speculative loop (engine.decoding.speculative.generate) hands each round's kept tokens to a
ReplyStream; the stream appends them to the context, detokenizes them incrementally, holds back text
that could begin a stop string, ends the reply at an end token or a stop string, sends TextPiece
events, and sends the reply's last figures and its Finished event when it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.decoding.detok import IncrementalDetokenizer
from engine.decoding.stop import StopMatcher
from engine.events import Event, Finished, FinishReason, RoundStats, TextPiece, TokenSpan
from engine.stats import GenerationStats


class ReplyStream:
    """`context` is the prompt and every token published since: the loop drafts and verifies after it.
    `started` is when the reply began, which its total time counts from."""

    def __init__(
        self,
        prompt_ids: list[int],
        tokenizer,
        eos_ids: set[int],
        stop: tuple[str, ...],
        stats: GenerationStats,
        emit: Callable[[Event], None],
    ):
        self.prompt_length = len(prompt_ids)
        self.context = list(prompt_ids)
        self.eos_ids = eos_ids
        self.stats = stats
        self.emit = emit
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = StopMatcher(stop)
        self.streamed: list[str] = []  # the text sent so far, piece by piece
        self.started = time.perf_counter()

    def publish(self, tokens: list[int], provenance: list[str]) -> FinishReason | None:
        """Appends tokens to the context and streams their text; returns "eos" or "stop" when one of
        them ends the reply (an end token, or the text reaching a stop string)."""
        end = next((i for i, token in enumerate(tokens) if token in self.eos_ids), None)
        if end is not None:
            tokens, provenance = tokens[: end + 1], provenance[: end + 1]
        shown: list[TokenSpan] = []
        reason: FinishReason | None = "eos" if end is not None else None
        for token, origin in zip(tokens, provenance, strict=True):
            self.context.append(token)
            self.stats.generated_tokens += 1
            shown.extend(self.stops.feed([TokenSpan(token, self.detok.add(token), origin)]))
            if self.stops.stopped:
                reason = "stop"
                break
        self.streamed.extend(span.text for span in shown)
        self.emit(TextPiece(tuple(shown)))
        return reason

    def finish(self, reason: FinishReason) -> Finished:
        """Ends the reply: releases text held back for a stop string that never came, then sends the
        reply's figures and its Finished event, which it returns."""
        if self.stops.stopped:
            text = "".join(self.streamed)  # everything before the stop string, and nothing of it
        else:
            held = self.stops.flush()  # text that could have begun a stop string, and did not
            if held:
                self.emit(TextPiece(tuple(held)))
            text = self.detok.text + self.detok.finish()
        self.stats.total_time_s = time.perf_counter() - self.started
        self.emit(RoundStats(self.stats.copy()))
        finished = Finished(reason, text, tuple(self.context[self.prompt_length :]), self.stats.copy())
        self.emit(finished)
        return finished
