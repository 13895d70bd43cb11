"""A draft model reads a prompt from the target's KV cache instead of running its own forward over it.

A quantized copy of the target has the target's layers, heads and head size, so the target's keys and
values for the tokens it has read can stand in for the draft's own: a memory copy instead of a prompt
prefill that costs as much as the target's (the INT8 copy's prefill doubled the prompt time of a long
question). What the draft then proposes may differ a little from what it would propose from its own
cache; the target verifies every proposal, so the output stays the target's. QSpec (arXiv 2410.11305)
shares one cache between a quantized draft and its target the same way.
"""

from __future__ import annotations


def _caches(runner) -> list | None:
    return runner.static_kv_caches()


def shares_cache_layout(donor, receiver) -> bool:
    """Whether `receiver`'s cache can hold `donor`'s entries: static caches with the same layers, heads,
    head size, dtype and device (their lengths may differ)."""
    given, taken = _caches(donor), _caches(receiver)
    if not given or not taken or len(given) != len(taken):
        return False

    def layout(cache):
        k = cache.k_cache  # [1, KV, S, D]
        return k.shape[:2], k.shape[3], k.dtype, k.device

    return all(layout(a) == layout(b) for a, b in zip(given, taken, strict=True))


def copy_cache(donor, receiver, start: int, end: int) -> int:
    """Copies positions [start, end) of every layer's keys and values from `donor`'s cache into
    `receiver`'s, whose cache must end at `start`; returns the receiver's new cache length."""
    end = min(end, donor.cache_length, receiver.context_length)
    if end <= start:
        return receiver.cache_length
    assert receiver.cache_length == start, (receiver.cache_length, start)
    for given, taken in zip(_caches(donor), _caches(receiver), strict=True):
        taken.k_cache[:, :, start:end].copy_(given.k_cache[:, :, start:end])
        taken.v_cache[:, :, start:end].copy_(given.v_cache[:, :, start:end])
    receiver.cache_length = end
    return end
