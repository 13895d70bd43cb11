"""Timing forwards on a device, and what the timings promise: the bound on a draft's speed-up, and
how far two runs' greedy tokens agree."""

from __future__ import annotations

import statistics
import time

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_times(runner, context: list[int], sizes, reps: int, tree: bool = False) -> dict[int, float]:
    """Median seconds of one forward over n new tokens after `context`, sizes interleaved. tree: a
    token tree of n nodes (a root, then two branches) instead of a chain."""
    device = runner.device
    runner.reset()
    runner.prefill(context[:-1])
    start = runner.cache_length
    times = {n: [] for n in sizes}
    for rep in range(reps + 2):
        for n in sizes:
            ids = torch.tensor([context[-1]] + [7 + i for i in range(n - 1)], device=device)
            synchronize(device)
            begun = time.perf_counter()
            if tree:
                runner.forward_tree(ids, [-1] + [max(0, i - 2) for i in range(1, n)])
            else:
                runner.forward(ids)
            synchronize(device)
            if rep >= 2:  # two rounds to capture graphs and warm caches
                times[n].append(time.perf_counter() - begun)
            runner.rollback(start)
    return {n: statistics.median(t) for n, t in times.items()}


def expected_tokens(alpha: float, k: int) -> float:
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def bound(alpha: float, t_target: float, t_draft: float, t_verify: dict[int, float]) -> tuple[float, int]:
    """Best speed-up over K of E(K) * t_target / (K * t_draft + t_verify(K + 1)), and that K."""
    best = max(
        (expected_tokens(alpha, k) * t_target / (k * t_draft + t_verify[k + 1]), k)
        for k in range(1, max(t_verify))
    )
    return round(best[0], 3), best[1]


def same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    """How many outputs equal the reference's, and where the others first leave it."""
    identical = sum(a == b for a, b in zip(outputs, reference, strict=True))
    first = [same_prefix(a, b) for a, b in zip(outputs, reference, strict=True) if a != b]
    return dict(identical=identical, of=len(reference), first_difference_at=first)
