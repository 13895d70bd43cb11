"""Drafters propose the next few tokens cheaply; the target then verifies them in one forward.

Every drafter is a `Drafter`, three calls and a name:
  propose(context, k) -> Draft   up to k tokens that may follow `context`, with the distributions
                                 they were drawn from (one-hot for a deterministic drafter);
  update(accepted)               the draft tokens the target kept, so a drafter with a cache can
                                 drop the rest;
  reset()                        forget everything about earlier requests.
Whatever else a drafter can do is a capability of its own, a small Protocol the loop and the planner
ask for (`capability(drafter, LooksAhead)`) instead of a flag every drafter carries:
  BeginsRequests      takes each request's sampling settings, generator, noise and cancel flag;
  LooksAhead          peek(context): what a proposal would be worth, before drafting;
  ProposesTrees       tree(...): other candidates beside the draft, for a token tree;
  ReadsTargetFeatures reads the target's hidden states after every forward (a draft head);
  StopsByConfidence   ends each proposal where its own confidence says the next token would not pay;
  ReadsPrompt         reads a new prompt before the first round;
  KnowsItsAcceptance  what adaptive K may assume of it before measuring it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar, cast, runtime_checkable

import torch

from engine.settings import SamplingSettings

if TYPE_CHECKING:
    from engine.decoding.confidence import StopRule
    from engine.decoding.sampling import PositionNoise
    from engine.decoding.tree import DraftTree


class Cancelled(Exception):
    """Raised inside a round when the user cancels; the loop catches it."""


@dataclass
class Draft:
    tokens: torch.Tensor  # [k] long, on the target's device
    probs: torch.Tensor | None  # [k, V] float32: the distribution each token was drawn from; None when greedy
    # seconds of this proposal spent reading tokens the drafter had skipped (after plain rounds):
    # a one-off cost that must not count as the per-token price of drafting
    catch_up_s: float = 0.0

    def __len__(self) -> int:
        return int(self.tokens.size(0))


@dataclass(frozen=True)
class Lookahead:
    condition: int | None = None  # e.g. a bucketed match length; None: one condition for every round
    available: int | None = None  # tokens a proposal could hold; None: as many as asked


@runtime_checkable
class Drafter(Protocol):
    name: str  # what the stats, the planner and the drafter memory call it

    def propose(self, context: list[int], k: int) -> Draft:
        """Up to k tokens that may follow `context` (fewer, or none, where it knows no more)."""
        ...

    def update(self, accepted: list[int]) -> None:
        """`accepted`: the draft tokens the target kept in the last round (a prefix of the draft)."""
        ...

    def reset(self) -> None:
        """Forget everything about earlier requests."""
        ...


@runtime_checkable
class BeginsRequests(Protocol):
    def begin(
        self,
        sampling: SamplingSettings,
        generator: torch.Generator | None,
        cancel: threading.Event | None = None,
        p_min: float = 0.0,
        noise: PositionNoise | None = None,
    ) -> None:
        """A new request starts: its sampling settings, random generator and cancel flag; `p_min`:
        stop drafting below this top probability. `noise` (seeded sampling, else None) gives the
        Exp(1) race for each context index: a sampling drafter that draws its tokens with it is
        accepted more often; the output never depends on it (see sampling.coupled_accept)."""
        ...


@runtime_checkable
class LooksAhead(Protocol):
    def peek(self, context: list[int]) -> Lookahead:
        """Cheap: what the next proposal would be conditioned on (for a lookup, its bucketed match
        length, the condition acceptance is measured under) and how many tokens it could hold (0: no
        match). A drafter without it is asked with Lookahead(): one condition, as many as asked."""
        ...


@runtime_checkable
class ProposesTrees(Protocol):
    def tree(self, context: list[int], draft: list[int], budget: int) -> DraftTree | None:
        """A token tree whose main branch is `draft`, the last proposal, plus alternatives this
        drafter knows, in at most `budget` nodes; None when it knows none (the round verifies the chain)."""
        ...


@runtime_checkable
class ReadsTargetFeatures(Protocol):
    # indices of the target's hidden states it reads (the runner's capture_hidden)
    wants_hidden: tuple[int, ...]

    def observe_target(self, hidden: tuple[int, torch.Tensor] | None, sequence: list[int]) -> None:
        """The target's features from its last forward: hidden = (first position, [n, F*C]) or None;
        `sequence` is the context after that forward."""
        ...


@runtime_checkable
class StopsByConfidence(Protocol):
    """Ends each proposal where its own confidence says the next token would not pay
    (engine.decoding.confidence): the planner sets `stop_rule` before each round (None: up to K) and
    reads back `last_confidences`, the top probability behind each token the last proposal holds."""

    stop_rule: StopRule | None
    last_confidences: list[float]


@runtime_checkable
class ReadsPrompt(Protocol):
    # True where its proposals read whatever tokens it skipped (a draft model's catch-up): while the
    # planner decodes plainly, the prompt can wait until it drafts, which it may never do
    prompt_can_wait: bool

    def prefill(self, context: list[int]) -> None:
        """Reads a new prompt before the first round, so that its cost is not charged to drafting."""
        ...


@runtime_checkable
class KnowsItsAcceptance(Protocol):
    # what adaptive K assumes before it has measured this drafter: acceptance of the first draft token,
    # and of each later one once the one before was kept (None: AcceptanceModel's defaults, which suit
    # lookup drafters, right for many tokens or wrong at the first)
    acceptance_prior: tuple[float, float] | None
    # how many rounds' worth that prior is (AcceptanceModel's prior_weight): 1 for a guess; more for
    # a figure measured before drafting, such as a quantized copy's check
    acceptance_prior_weight: float


Capability = TypeVar("Capability")
_capable: dict[tuple[type, type], bool] = {}


def capability(drafter: object, protocol: type[Capability]) -> Capability | None:
    """`drafter` as one that has `protocol`'s capability, or None. A capability belongs to a class (its
    members are methods, or attributes every instance sets), so it is checked once per class: a
    Protocol's isinstance costs about 12 microseconds, and the planner asks several times a round."""
    key = (type(drafter), protocol)
    has = _capable.get(key)
    if has is None:
        has = _capable[key] = isinstance(drafter, protocol)
    return cast(Capability, drafter) if has else None


def match_bucket(length: int) -> int:
    """A lookup's match length, bucketed so that acceptance is measured under few conditions."""
    if length <= 4:
        return length
    return 6 if length <= 7 else 12 if length <= 15 else 16


def empty_draft(vocab_size: int, device, catch_up_s: float = 0.0) -> Draft:
    tokens = torch.zeros(0, dtype=torch.long, device=device)
    return Draft(tokens, torch.zeros((0, vocab_size), device=device), catch_up_s)


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
