"""Stop strings: the reply ends before the first occurrence of any of them, and no part of a stop
string is ever streamed.

Text that could still turn into a stop string is held back until the next token settles it, so a
consumer never shows characters that a later token reveals to be the start of a stop string.
Matching is on the detokenized text, since a stop string may start or end inside a token.
"""

from __future__ import annotations

from engine.events import TokenSpan


class StopMatcher:
    def __init__(self, stops: tuple[str, ...] | list[str]):
        self.stops = tuple(s for s in stops if s)
        self.held: list[TokenSpan] = []  # spans not yet released, oldest first
        self.stopped = False

    def feed(self, spans: list[TokenSpan]) -> list[TokenSpan]:
        """The spans that are safe to stream now. After a stop string is found, `stopped` is True and
        the returned spans end just before it (the last one's text cut)."""
        if not self.stops:
            return list(spans)
        released: list[TokenSpan] = []
        for span in spans:
            self.held.append(span)
            text = "".join(s.text for s in self.held)
            found = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
            if found:
                self.stopped = True
                released.extend(self._cut(min(found)))
                self.held = []
                return released
            released.extend(self._release(len(text) - self._unsettled(text)))
        return released

    def flush(self) -> list[TokenSpan]:
        """What is still held back, when the reply ends for another reason."""
        held, self.held = self.held, []
        return held

    def _unsettled(self, text: str) -> int:
        """Length of the longest end of `text` that is the beginning of some stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest

    def _release(self, settled: int) -> list[TokenSpan]:
        """Releases the held spans that lie wholly within the first `settled` characters."""
        released, used = [], 0
        while self.held and used + len(self.held[0].text) <= settled:
            span = self.held.pop(0)
            used += len(span.text)
            released.append(span)
        return released

    def _cut(self, end: int) -> list[TokenSpan]:
        """Every held span, its text cut at character `end`: the spans wholly inside the stop string
        come back empty, so each token of the reply still has its span (and its provenance counted)."""
        out, used = [], 0
        for span in self.held:
            keep = span.text[: max(0, end - used)]
            out.append(span if keep == span.text else TokenSpan(span.token_id, keep, span.provenance))
            used += len(span.text)
        return out
