"""The engine's interfaces are Protocols, and whatever has one matches it member by member: the real
drafters and runners, and the fakes tests use in their place (same names, same call signatures), so
neither can drift from the Protocol the loop and the planner are written against."""

from __future__ import annotations

import inspect
from typing import Protocol

from engine.decoding.drafters import (
    BeginsRequests,
    Drafter,
    KnowsItsAcceptance,
    LooksAhead,
    ModelDrafter,
    NgramDrafter,
    ProposesTrees,
    ReadsPrompt,
    ReadsTargetFeatures,
    StopsByConfidence,
    SuffixDrafter,
    capability,
)
from engine.runtime.eager import ModelRunner
from engine.runtime.fastpath import FastRunner
from engine.runtime.protocol import CompilingRunner, Runner, TreeRunner
from tests.fake_drafters import ConfidentDrafter, EmptyDrafter

CAPABILITIES = (
    BeginsRequests,
    LooksAhead,
    ProposesTrees,
    ReadsTargetFeatures,
    StopsByConfidence,
    ReadsPrompt,
    KnowsItsAcceptance,
)


def protocol_members(protocol: type) -> tuple[dict[str, inspect.Signature], set[str]]:
    """(methods with their signatures, data members) of a Protocol and the Protocols it extends."""
    methods, data = {}, set()
    for cls in reversed(protocol.__mro__):
        if cls is Protocol or not getattr(cls, "_is_protocol", False):
            continue
        data |= set(cls.__dict__.get("__annotations__", {}))
        for name, member in vars(cls).items():
            if inspect.isfunction(member) and not name.startswith("_"):
                methods[name] = inspect.signature(member)
    return methods, data


def shape(signature: inspect.Signature) -> list[tuple[str, object, bool]]:
    """What a caller relies on: each parameter's name, kind and whether it may be left out."""
    return [(p.name, p.kind, p.default is not p.empty) for p in signature.parameters.values()]


def mismatches(implementation: object, protocol: type) -> list[str]:
    methods, data = protocol_members(protocol)
    found = [f"{name} is missing" for name in sorted(data) if not hasattr(implementation, name)]
    for name, signature in methods.items():
        method = getattr(type(implementation), name, None)
        if method is None:
            found.append(f"{name}() is missing")
        elif shape(inspect.signature(method)) != shape(signature):
            found.append(f"{name}{inspect.signature(method)} is not {name}{signature}")
    return found


def capabilities_of(drafter) -> set[str]:
    return {protocol.__name__ for protocol in CAPABILITIES if isinstance(drafter, protocol)}


def real_drafters(tiny) -> dict[str, tuple[object, set[str]]]:
    from engine.decoding.drafters.head import HeadDrafter
    from tests.test_head import random_head

    vocab = tiny.model.config.vocab_size
    runner = ModelRunner(tiny.model)
    head = HeadDrafter(random_head(tiny.model, 32), tiny.model.get_input_embeddings(), vocab, 64)
    lookup = {"BeginsRequests", "LooksAhead", "ProposesTrees"}
    return {
        "ngram": (NgramDrafter(vocab, "cpu"), lookup),
        "suffix": (SuffixDrafter(vocab, "cpu"), lookup),
        "model": (ModelDrafter(runner, vocab), {"BeginsRequests", "ReadsPrompt", "KnowsItsAcceptance"}),
        "head": (head, {protocol.__name__ for protocol in CAPABILITIES} - {"LooksAhead"}),
    }


def fake_drafters() -> dict[str, tuple[object, set[str]]]:
    from tests.test_adaptive import SyntheticDrafter
    from tests.test_trees import FixedTreeDrafter

    return {
        "empty": (EmptyDrafter(), set()),
        "confident": (ConfidentDrafter(), {"StopsByConfidence"}),
        "synthetic": (SyntheticDrafter("lookup", lambda rng, k, c: 0, 0.01), {"LooksAhead"}),
        "fixed tree": (FixedTreeDrafter([1, 2], side=3), {"ProposesTrees"}),
    }


def test_every_drafter_and_fake_is_a_drafter_with_the_capabilities_it_claims(tiny):
    for name, (drafter, expected) in {**real_drafters(tiny), **fake_drafters()}.items():
        assert isinstance(drafter, Drafter), name
        assert mismatches(drafter, Drafter) == [], name
        assert capabilities_of(drafter) == expected, name
        for protocol in CAPABILITIES:
            if protocol.__name__ in expected:
                assert mismatches(drafter, protocol) == [], (name, protocol.__name__)
                assert capability(drafter, protocol) is drafter
            else:
                assert capability(drafter, protocol) is None


def test_a_drafter_with_a_method_that_drifted_is_caught():
    """The check itself can fail: a lookup whose peek takes another argument."""

    class DriftedLookup(EmptyDrafter):
        def peek(self, context, k):
            return None

    assert mismatches(DriftedLookup(), LooksAhead) == [
        f"peek{inspect.signature(DriftedLookup.peek)} is not peek{protocol_members(LooksAhead)[0]['peek']}"
    ]
    missing = ["name is missing", "propose() is missing", "update() is missing", "reset() is missing"]
    assert mismatches(object(), Drafter) == missing


def test_every_runner_has_the_members_the_loop_uses(tiny):
    eager, fast = ModelRunner(tiny.model), FastRunner(tiny.model, compiled="off")
    for runner in (eager, fast):
        assert isinstance(runner, Runner) and mismatches(runner, Runner) == []
    assert not eager.supports_trees and eager.verify_limit is None and eager.capture_hidden == ()
    assert fast.supports_trees and fast.verify_limit is None and fast.last_hidden is None
    assert not isinstance(eager, TreeRunner) and not isinstance(eager, CompilingRunner)
    for protocol in (TreeRunner, CompilingRunner):
        assert isinstance(fast, protocol) and mismatches(fast, protocol) == [], protocol.__name__
