"""What rounds really cost and gave, timed the way the loop runs them, and whether drafting is winning.

A round's price (engine.decoding.pricing) is built from its parts: K draft steps and a verify forward
of K + 1 tokens. The loop pays more than that: choosing the round, accepting and rolling back,
streaming the text, the stats, a draft head reading the target's features. Timed from one round's
plan to the next one's, every round pays all of it, a drafted round and a plain step alike, so
`PaceLedger` keeps, per kind of round:

  overhead    the median of (whole round - draft - verify) over recent rounds: what the pricer adds
              to each side of its comparison;
  this reply  tokens and seconds of this reply's drafted rounds (per drafter) and of its plain steps:
              the honest comparison. Where a drafter's rounds gave fewer tokens than plain steps would
              have in the same seconds, by more than chance explains (LOSS_Z standard errors of the
              rounds' own spread), `losing` says so, whatever the price said.

Medians over a window, and a comparison within one reply (the same prompt, the same machine load
within seconds), keep one busy moment from deciding anything.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import mean, median, stdev

# rounds of each kind whose overhead is remembered (across replies: the loop's overhead is steady)
OVERHEAD_WINDOW = 15
# a drafter's rounds in this reply judged against plain steps: at least MIN_DRAFTED of its last
# REPLY_WINDOW rounds, and at least MIN_PLAIN plain steps (this reply's, else the latest ones)
REPLY_WINDOW, MIN_DRAFTED, MIN_PLAIN = 16, 6, 2
# How sure the comparison must be that drafting loses: its rounds' mean excess (tokens kept minus
# what plain steps give in the same seconds) at least LOSS_Z standard errors below zero, the spread
# taken at least MIN_SPREAD tokens (a few rounds that kept alike say little about the next)
LOSS_Z, MIN_SPREAD = 2.0, 0.3
PLAIN_WINDOW = 9  # plain steps whose median is the plain pace
# Drafted rounds in a row after which one plain step is run (a control): where drafting wins by a
# third, one plain step in 16 rounds costs about 1 % of the reply
CONTROL_AFTER = 16


@dataclass
class _Round:
    member: int | None  # the drafter's index among the planner's members; None: a plain step
    tokens: int
    work_s: float  # draft + verify, as the round timed them


class PaceLedger:
    def __init__(self):
        self._open: _Round | None = None
        self._opened_at: float | None = None
        self._overhead = {True: deque(maxlen=OVERHEAD_WINDOW), False: deque(maxlen=OVERHEAD_WINDOW)}
        self._plain_s: deque[float] = deque(maxlen=PLAIN_WINDOW)  # whole plain steps, latest last
        self._reply_plain: list[float] = []
        self._reply_drafted: dict[int, deque[tuple[int, float]]] = {}
        self._drafted_since_plain = 0

    def start_reply(self) -> None:
        self._open, self._opened_at = None, None
        self._reply_plain, self._reply_drafted = [], {}
        self._drafted_since_plain = 0

    def stamp(self, now: float) -> None:
        """A round is being planned at `now`: the one before it, if any, ends here."""
        if self._open is not None and self._opened_at is not None:
            self._close(self._open, now - self._opened_at)
        self._open, self._opened_at = None, now

    def record(self, member: int | None, tokens: int, draft_s: float, verify_s: float) -> None:
        """The round planned at the last stamp: `member` drafted (None: a plain step), it emitted
        `tokens`, its draft and verify took these seconds."""
        self._open = _Round(member, tokens, draft_s + verify_s)
        self._drafted_since_plain = 0 if member is None else self._drafted_since_plain + 1

    def _close(self, round: _Round, whole_s: float) -> None:
        # never less than its own parts: a clock that did not run (a simulation) adds no overhead
        whole_s = max(whole_s, round.work_s)
        drafted = round.member is not None
        self._overhead[drafted].append(whole_s - round.work_s)
        if not drafted:
            self._plain_s.append(whole_s)
            self._reply_plain.append(whole_s)
            return
        window = self._reply_drafted.setdefault(round.member, deque(maxlen=REPLY_WINDOW))
        window.append((round.tokens, whole_s))

    def overhead(self, drafted: bool) -> float:
        """Seconds a round of this kind spends outside its draft and verify (median); 0 before any."""
        seen = self._overhead[drafted]
        return median(seen) if seen else 0.0

    def plain_rate(self) -> float | None:
        """Tokens per second of plain steps: this reply's where it has MIN_PLAIN, else the latest ones."""
        steps = self._reply_plain[-PLAIN_WINDOW:]
        steps = steps if len(steps) >= MIN_PLAIN else list(self._plain_s)
        if len(steps) < MIN_PLAIN:
            return None
        return 1.0 / median(steps)

    def drafted_rate(self, member: int) -> float | None:
        """Tokens per second of this drafter's latest rounds in this reply; None under MIN_DRAFTED."""
        window = self._reply_drafted.get(member)
        if window is None or len(window) < MIN_DRAFTED:
            return None
        return sum(tokens for tokens, _ in window) / sum(seconds for _, seconds in window)

    def losing(self, member: int, margin: float = 0.0) -> bool:
        """Whether this drafter's latest rounds in this reply gave fewer tokens than plain steps would
        have in their seconds (by `margin`), beyond chance; False before both sides are measured."""
        excess = self._excess(member, margin)
        if excess is None:
            return False
        spread = max(stdev(excess), MIN_SPREAD)
        return mean(excess) + LOSS_Z * spread / len(excess) ** 0.5 < 0

    def winning(self, member: int) -> bool:
        """Whether this drafter's latest rounds in this reply gave more tokens than plain steps would have."""
        excess = self._excess(member, 0.0)
        return excess is not None and mean(excess) > 0

    def _excess(self, member: int, margin: float) -> list[float] | None:
        """Per round: tokens kept minus what plain steps give in its seconds; None under MIN_DRAFTED rounds."""
        window, plain = self._reply_drafted.get(member), self.plain_rate()
        if window is None or len(window) < MIN_DRAFTED or plain is None:
            return None
        pace = plain * (1 + margin)
        return [tokens - pace * seconds for tokens, seconds in window]

    def control_due(self) -> bool:
        """Whether this reply has drafted CONTROL_AFTER rounds since its last plain step (or since it
        began; MIN_DRAFTED while no plain pace is known at all): one plain step then keeps the
        comparison's plain side measured close in time."""
        after = CONTROL_AFTER if self.plain_rate() is not None else MIN_DRAFTED
        return self._drafted_since_plain >= after

    def forget_member(self, member: int) -> None:
        """A re-probe starts this drafter's comparison over: its earlier rounds lost already."""
        self._reply_drafted.pop(member, None)
