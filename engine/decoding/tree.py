"""Token trees: several candidate continuations verified in one target forward (SpecInfer, EAGLE-2,
Medusa), on runners that can attend along a tree (FastRunner.forward_tree).

A tree's main branch is the drafter's usual chain; the other nodes are alternatives it would
otherwise throw away: the head's second choice at a depth, another earlier occurrence of the lookup
match. Every candidate is deterministic (a fixed token, not a sample), so verification is exact at
any temperature by one rule: at each node the target picks its own next token (argmax when greedy,
the seeded race when seeded, a sample otherwise) and the walk moves to the child holding that token,
if any. Every emitted token is therefore drawn from the target's distribution given the path so far.

Sizing (engine.decoding.pricing.Pricer.tree_size): one side node beside each draft token,
shallowest first, as many as the tokens they are expected to save pay for their dearer verify. What a
side node saves is measured: how often the chain fails at its depth, and how often a side node was
right where it did. The price is what trees of that size measured (VerifyCostCurve.tree_price): on
a CPU a few nodes, where a verify of up to six tokens costs about one step; on a GPU, wide.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.decoding.sampling import PositionNoise, coupled_sample, probs_from_logits, sample
from engine.runtime.protocol import TreeRunner
from engine.settings import SamplingSettings


@dataclass
class DraftTree:
    """Nodes after the last context token (the root): tokens[i] hangs under parents[i] (-1: the root;
    else an earlier node). Nodes 0..chain-1 are the main branch, each the parent of the next."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    @classmethod
    def chain(cls, tokens: list[int]) -> DraftTree:
        return cls(list(tokens), list(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def chain_length(self) -> int:
        length = 0
        while length < len(self.tokens) and self.parents[length] == length - 1:
            length += 1
        return length

    def add(self, token: int, parent: int) -> int | None:
        """Adds a node under `parent` unless a sibling already holds `token`; returns its index."""
        if any(p == parent and t == token for t, p in zip(self.tokens, self.parents, strict=True)):
            return None
        self.tokens.append(token)
        self.parents.append(parent)
        return len(self.tokens) - 1

    def add_branch(self, tokens: list[int], parent: int, budget: int) -> None:
        """Hangs the continuation `tokens` under `parent`, sharing nodes it already has, within `budget` nodes."""
        for token in tokens:
            child = next(
                (
                    i
                    for i, (t, p) in enumerate(zip(self.tokens, self.parents, strict=True))
                    if p == parent and t == token
                ),
                None,
            )
            if child is None:
                if len(self.tokens) >= budget:
                    return
                child = self.add(token, parent)
            parent = child

    def has_side_node_at(self, depth: int) -> bool:
        """Whether a node off the main branch stands beside its node at `depth` (same parent)."""
        parent = depth - 1
        return any(p == parent for p in self.parents[self.chain_length :])

    def children(self) -> dict[int, dict[int, int]]:
        """parent (-1 = root) -> {token: child index}."""
        table: dict[int, dict[int, int]] = {}
        for index, (token, parent) in enumerate(zip(self.tokens, self.parents, strict=True)):
            table.setdefault(parent, {})[token] = index
        return table


@dataclass
class TreeOutcome:
    accepted: list[int]  # tokens along the accepted path
    next_token: int  # the target's token after it
    path: list[int]  # node indices of the accepted path


def walk(tree: DraftTree, choose) -> TreeOutcome:
    """Follows the target's choices down the tree. choose(row, depth) -> the target's token at tree
    row `row` (0 = the root, i + 1 = node i), `depth` tokens past the context."""
    children = tree.children()
    node, depth, accepted, path = -1, 0, [], []
    while True:
        token = choose(node + 1, depth)
        child = children.get(node, {}).get(token)
        if child is None:
            return TreeOutcome(accepted, token, path)
        accepted.append(token)
        path.append(child)
        node, depth = child, depth + 1


def verify_tree(
    target: TreeRunner,
    tree: DraftTree,
    context: list[int],
    sampling: SamplingSettings,
    generator,
    noise: PositionNoise | None,
) -> tuple[TreeOutcome, float]:
    """One target forward over the root and the tree, then the walk; keeps the accepted path in the
    target's cache. Returns the outcome and the forward's seconds (host sync included)."""
    started = time.perf_counter()
    logits = target.forward_tree(
        [context[-1], *tree.tokens], [-1, *(p + 1 for p in tree.parents)]
    )  # [n+1, V]
    if sampling.greedy:
        choices = logits.argmax(-1).tolist()

        def choose(row, depth):
            return choices[row]

    else:
        probs = probs_from_logits(logits, sampling)  # [n+1, V]

        def choose(row, depth):
            if noise is not None:
                race = noise.race(len(context) + depth, 1, probs.size(-1))[0]
                return int(coupled_sample(probs[row], race))
            return int(sample(probs[row], generator))

    outcome = walk(tree, choose)
    target.keep_path([0, *(i + 1 for i in outcome.path)])
    return outcome, time.perf_counter() - started
