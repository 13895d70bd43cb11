"""Drafters propose the next few tokens cheaply; the target then verifies them in one forward.

Every drafter has the same two calls:
  propose(context, k) -> Draft   up to k tokens that may follow `context`, with the distributions
                                 they were drawn from (one-hot for a deterministic drafter);
  update(accepted)               the draft tokens the target kept, so a drafter with a cache can
                                 drop the rest.
and one optional call that adaptive K uses before it chooses K:
  peek(context) -> Lookahead     what a proposal would be worth, without drafting: for a lookup
                                 drafter, its match length (the condition acceptance is measured
                                 under) and how many tokens it could propose (0: no match).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.settings import SamplingSettings


class Cancelled(Exception):
    """Raised inside a round when the user cancels; the loop catches it."""


@dataclass
class Draft:
    tokens: torch.Tensor  # [k] long, on the target's device
    probs: torch.Tensor | None  # [k, V] float32: the distribution each token was drawn from; None when greedy

    def __len__(self) -> int:
        return int(self.tokens.size(0))


@dataclass(frozen=True)
class Lookahead:
    condition: int | None = None  # e.g. a bucketed match length; None: one condition for every round
    available: int | None = None  # tokens a proposal could hold; None: as many as asked


class Drafter:
    name = "none"
    # forwards a round costs besides the target's; zero for drafters without a model
    has_model = False
    # its catch-up reads whatever tokens it has not seen (a draft model): while the planner decodes
    # plainly, it need not read a prompt it may never draft after
    reads_prompt_when_drafting = False
    sampling = SamplingSettings()
    # seconds the last proposal spent reading tokens the drafter had skipped (after plain rounds);
    # a one-off cost that must not count as the per-token price of drafting
    catch_up_s = 0.0
    noise = None
    # indices of the target's hidden states this drafter reads (see observe_target); empty: none
    wants_hidden: tuple[int, ...] = ()
    # what adaptive K assumes before it has measured this drafter: acceptance of the first draft token,
    # and of each later one once the one before was kept (None: AcceptanceModel's defaults, which suit
    # lookup drafters, right for many tokens or wrong at the first)
    acceptance_prior: tuple[float, float] | None = None
    # how many rounds' worth that prior is (AcceptanceModel's prior_weight): 1 for a guess; more for
    # a figure measured before drafting, such as a quantized copy's check
    acceptance_prior_weight = 1.0
    # a drafter that stops each proposal where its own confidence says the next token would not pay
    # (engine.decoding.confidence): adaptive K sets `stop_rule` before each round and reads back
    # `last_confidences`, the top probability behind each token proposed
    confidence_stops = False
    stop_rule = None
    last_confidences: list[float] = []

    def begin(
        self, sampling: SamplingSettings, generator: torch.Generator | None, cancel=None, p_min=0.0
    ) -> None:
        """A new request starts: its sampling settings, random generator and cancel flag."""
        self.sampling = sampling

    def couple(self, noise) -> None:
        """Seeded sampling: `noise` (sampling.PositionNoise, or None) gives the Exp(1) race for each
        context index. A sampling drafter that draws its tokens with it is accepted more often;
        the output never depends on it (see sampling.coupled_accept)."""
        self.noise = noise

    def propose(self, context: list[int], k: int) -> Draft:
        raise NotImplementedError

    def tree(self, context: list[int], draft: list[int], budget: int):
        """A token tree (engine.decoding.tree.DraftTree) whose main branch is `draft`, the last
        proposal, plus alternatives this drafter knows, in at most `budget` nodes; None when it knows
        none (the round verifies the chain)."""
        return None

    def peek(self, context: list[int]) -> Lookahead:
        """Cheap: what the next proposal would be conditioned on. Model drafters know nothing in advance."""
        return Lookahead()

    def update(self, accepted: list[int]) -> None:
        """`accepted`: the draft tokens the target kept in the last round (a prefix of the draft)."""

    def prefill(self, context: list[int]) -> None:
        """Reads a new prompt before the first round, so that its cost is not charged to drafting."""

    def observe_target(self, hidden, sequence: list[int]) -> None:
        """The target's features from its last forward, for drafters that read them (wants_hidden):
        hidden = (first position, [n, F*C]) or None; `sequence` is the context after that forward."""

    def reset(self) -> None:
        """Forget everything about earlier requests."""


def match_bucket(length: int) -> int:
    """A lookup's match length, bucketed so that acceptance is measured under few conditions."""
    if length <= 4:
        return length
    return 6 if length <= 7 else 12 if length <= 15 else 16


def empty_draft(vocab_size: int, device) -> Draft:
    return Draft(torch.zeros(0, dtype=torch.long, device=device), torch.zeros((0, vocab_size), device=device))


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
