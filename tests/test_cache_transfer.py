"""A draft model that shares the target's cache layout reads a prompt from the target's KV cache."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.decoding.drafters import ModelDrafter
from engine.runtime.cache_transfer import copy_cache, shares_cache_layout
from engine.runtime.eager import ModelRunner
from engine.runtime.fastpath import FastRunner

PROMPT = [1, 502, 33, 9001, 77, 4, 1200, 18, 65, 3000, 41, 7, 880, 12]


def fast(model) -> FastRunner:
    return FastRunner(model, compiled="off")


def read_lengths(runner) -> list[int]:
    """Records how many tokens each prefill of `runner` reads."""
    lengths, prefill = [], runner.prefill

    def recording(ids):
        lengths.append(len(ids))
        return prefill(ids)

    runner.prefill = recording
    return lengths


def test_a_copy_of_the_target_reads_the_prompt_from_its_cache_and_proposes_what_it_would_alone(make_tiny):
    loaded = make_tiny(seed=4, layers=2)
    target = fast(loaded.model)
    target.prefill(PROMPT)
    vocab = target.vocab_size
    sharing = ModelDrafter(fast(copy.deepcopy(loaded.model)), vocab, "copy", cache_donor=target)
    alone = ModelDrafter(fast(copy.deepcopy(loaded.model)), vocab, "copy")
    read = read_lengths(sharing.runner)

    context = PROMPT + [5]  # the target's cache holds PROMPT; its next token comes after
    shared_draft, own_draft = sharing.propose(context, 4), alone.propose(context, 4)

    assert read == [1]  # the target's token alone: the prompt was copied
    assert shared_draft.tokens.tolist() == own_draft.tokens.tolist()
    for layer, kept in zip(sharing.runner.fast.kv_caches, alone.runner.fast.kv_caches, strict=True):
        torch.testing.assert_close(layer.k_cache[:, :, : len(PROMPT)], kept.k_cache[:, :, : len(PROMPT)])


def test_a_few_tokens_a_round_are_read_by_the_draft_itself(make_tiny):
    loaded = make_tiny(seed=4, layers=2)
    target = fast(loaded.model)
    target.prefill(PROMPT)
    drafter = ModelDrafter(fast(copy.deepcopy(loaded.model)), target.vocab_size, "copy", cache_donor=target)
    drafter.prefill(PROMPT)
    read = read_lengths(drafter.runner)
    target.prefill([5])  # a round: the target keeps its token, then the next one comes
    drafter.propose(PROMPT + [5, 6], 2)
    assert read == [2]  # nothing copied for two tokens
    assert drafter.runner.cache_length == len(PROMPT) + 2 + 1  # the context, then one draft token fed


def test_only_caches_of_the_same_shape_are_shared(make_tiny):
    target = fast(make_tiny(seed=4, layers=2).model)
    assert shares_cache_layout(target, fast(make_tiny(seed=5, layers=2).model))
    assert not shares_cache_layout(target, fast(make_tiny(seed=5, layers=3).model))  # layers differ
    assert not shares_cache_layout(target, fast(make_tiny(seed=5, layers=2, hidden=128).model))  # heads
    assert not shares_cache_layout(target, ModelRunner(make_tiny(seed=5).model))  # no static cache


def test_a_copy_stops_at_what_the_target_holds(make_tiny):
    loaded = make_tiny(seed=4, layers=2)
    target, receiver = fast(loaded.model), fast(copy.deepcopy(loaded.model))
    target.prefill(PROMPT[:6])
    assert copy_cache(target, receiver, 0, len(PROMPT)) == 6  # the rest is the receiver's to read
    assert receiver.cache_length == 6
    with pytest.raises(AssertionError):
        copy_cache(target, receiver, 2, 6)  # the receiver's cache must end where the copy starts


def test_the_engine_gives_a_quantized_copy_the_targets_cache_and_stays_lossless(make_tiny):
    from engine.models.quantize import quantize_model
    from engine.session import ChatEngine
    from engine.settings import SamplingSettings, SpeculationSettings

    loaded = make_tiny(seed=4, layers=2)
    sampling = SamplingSettings(temperature=0.0, max_new_tokens=24)
    engine = ChatEngine(
        loaded, quantize_model(loaded, "int8"), SpeculationSettings(drafter="model", k=3), sampling, "off"
    )
    assert engine._model_drafter.cache_donor is engine._runner
    alone = ChatEngine(loaded, None, SpeculationSettings(drafter="none"), sampling, "off")
    drafted = engine.generate_ids(PROMPT)
    assert drafted.stats.drafted > 0
    assert list(drafted.token_ids) == list(alone.generate_ids(PROMPT).token_ids)
