"""ChatEngine: templates, multi-turn cache reuse, drafter choice, limits, streaming text."""

from __future__ import annotations

import threading

import pytest
import torch

from engine.errors import ContextOverflowError, IncompatibleDraftError
from engine.events import Finished, RoundStats, TextPiece
from engine.session import ChatEngine
from engine.settings import SamplingSettings, SpeculationSettings


@pytest.fixture(scope="module")
def draft(make_tiny):
    return make_tiny(seed=1, layers=1)


def greedy_reference(loaded, prompt_ids, max_new_tokens):
    output = loaded.model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=list(loaded.eos_token_ids),
    )
    return output[0, len(prompt_ids) :].tolist()


def test_second_turn_prefills_only_new_tokens_and_equals_plain_greedy(target, draft):
    engine = ChatEngine(
        target, draft, SpeculationSettings(drafter="model", k=3), SamplingSettings(max_new_tokens=24)
    )
    messages = [{"role": "user", "content": "Name three colours."}]
    first = engine.respond(messages)
    assert first.stats.prefill_tokens == first.stats.prompt_tokens
    messages += [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "And three animals?"},
    ]
    prompt_ids = engine.prompt_ids(messages)
    second = engine.respond(messages)
    assert second.stats.prompt_tokens == len(prompt_ids)
    assert second.stats.prefill_tokens < len(prompt_ids) - len(engine.prompt_ids(messages[:1]))
    assert list(second.token_ids) == greedy_reference(target, prompt_ids, 24)
    assert second.stats.drafter == f"model:{draft.name}"
    assert second.stats.target_step_time_s and second.stats.speedup


def test_settings_are_read_at_each_call(target):
    engine = ChatEngine(target)
    messages = [{"role": "user", "content": "Hi"}]
    engine.sampling = SamplingSettings(max_new_tokens=5)
    engine.speculation = SpeculationSettings(drafter="none")
    finished = engine.respond(messages)
    assert finished.stats.drafter == "none" and len(finished.token_ids) <= 5
    engine.speculation = SpeculationSettings(drafter="ngram", k=2)
    assert engine.respond(messages).stats.drafter == "ngram"


def test_every_drafter_setting_is_made_by_the_registry(target):
    """Each drafter a user can choose has its maker in drafter_registry.DRAFTERS, and each maker gives the
    drafters a reply with that setting drafts with."""
    from engine.drafter_registry import DRAFTERS
    from engine.settings import DRAFTER_KINDS

    assert set(DRAFTERS) == set(DRAFTER_KINDS)
    engine = ChatEngine(target)
    names = {
        kind: [d.name for d in DRAFTERS[kind](engine, engine.speculation).drafters]
        for kind in ("none", "ngram", "suffix", "auto")
    }
    assert names == {"none": [], "ngram": ["ngram"], "suffix": ["suffix"], "auto": ["ngram", "suffix"]}


def test_model_drafter_without_a_draft_falls_back_to_ngram(target):
    engine = ChatEngine(
        target, None, SpeculationSettings(drafter="model"), SamplingSettings(max_new_tokens=4)
    )
    finished = engine.respond([{"role": "user", "content": "Hi"}])
    assert finished.stats.drafter == "ngram" and "n-gram" in finished.stats.note


def test_streamed_text_equals_final_decode_with_emoji_and_cjk(target, draft):
    engine = ChatEngine(target, draft, SpeculationSettings(k=4), SamplingSettings(max_new_tokens=60))
    for content in ("Translate 🙂🎉 into 中文, please: 你好世界", "日本語で答えて 👩‍👩‍👧"):
        events = []
        finished = engine.respond([{"role": "user", "content": content}], on_event=events.append)
        streamed = "".join(event.text for event in events if isinstance(event, TextPiece))
        decoded = target.tokenizer.decode(list(finished.token_ids), skip_special_tokens=True)
        assert streamed == finished.text == decoded
        assert isinstance(events[-1], Finished) and any(isinstance(e, RoundStats) for e in events)


def test_seeded_sampling_through_the_engine_repeats(target, draft):
    engine = ChatEngine(
        target,
        draft,
        SpeculationSettings(k=3),
        SamplingSettings(temperature=0.8, top_k=50, max_new_tokens=12, seed=7),
    )
    messages = [{"role": "user", "content": "Tell me a story."}]
    outputs = {engine.respond(messages).token_ids for _ in range(5)}
    assert len(outputs) == 1


def test_cancel_then_next_turn_equals_plain_greedy(target, draft):
    engine = ChatEngine(target, draft, SpeculationSettings(k=4), SamplingSettings(max_new_tokens=30))
    cancel = threading.Event()

    def on_event(event):
        if isinstance(event, TextPiece):
            cancel.set()

    messages = [{"role": "user", "content": "Count to ten."}]
    assert engine.respond(messages, on_event, cancel).reason == "cancelled"
    messages = [{"role": "user", "content": "Count to ten, slowly."}]
    finished = engine.respond(messages)
    assert list(finished.token_ids) == greedy_reference(target, engine.prompt_ids(messages), 30)


def test_prompt_past_the_context_is_refused_with_numbers(target):
    engine = ChatEngine(target, sampling=SamplingSettings(max_new_tokens=4))
    limit = target.model.config.max_position_embeddings
    with pytest.raises(ContextOverflowError, match=f"{limit}"):
        engine.generate_ids([100] * limit)
    assert len(engine.generate_ids([100] * (limit - 2)).token_ids) <= 2


def test_incompatible_draft_is_refused(target, builtin_tokenizer):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from engine.models.loaded import LoadedModel

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=1000,
    )
    small = LoadedModel(
        "small", AutoModelForCausalLM.from_config(config), builtin_tokenizer, target.device, target.dtype
    )
    with pytest.raises(IncompatibleDraftError, match="1000"):
        ChatEngine(target, small)


def test_calibrate_is_cached(target):
    engine = ChatEngine(target)
    first = engine.calibrate()
    assert first > 0 and engine.calibrate() == first


def test_auto_drafting_over_two_turns_equals_plain_greedy_and_names_each_round(target, draft):
    engine = ChatEngine(
        target, draft, SpeculationSettings(drafter="auto"), SamplingSettings(max_new_tokens=24)
    )
    messages = [{"role": "user", "content": "Say the days of the week, twice."}]
    first = engine.respond(messages)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Once more."}]
    prompt_ids = engine.prompt_ids(messages)
    second = engine.respond(messages)
    assert list(second.token_ids) == greedy_reference(target, prompt_ids, 24)
    stats = second.stats
    assert stats.drafter == "auto" and len(stats.drafter_history) == stats.rounds
    assert set(stats.drafter_history) <= {"none", "ngram", "suffix", f"model:{draft.name}"}
    assert sum(stats.drafter_rounds.values()) == stats.rounds


def test_finished_replies_feed_the_suffix_index_across_conversations(target):
    engine = ChatEngine(
        target, None, SpeculationSettings(drafter="suffix"), SamplingSettings(max_new_tokens=32)
    )
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    first = engine.respond(messages)
    assert engine._suffix.history_entries > 0
    engine.reset()  # a new conversation asks the same thing: the earlier reply is drafted
    again = engine.respond(messages)
    assert again.token_ids == first.token_ids
    assert again.stats.accepted >= len(first.token_ids) // 2
    assert "suffix" in again.stats.drafter_history


def test_stored_conversations_can_be_indexed(target):
    engine = ChatEngine(
        target, None, SpeculationSettings(drafter="suffix"), SamplingSettings(max_new_tokens=16)
    )
    messages = [{"role": "user", "content": "Count to ten."}]
    reference = greedy_reference(target, engine.prompt_ids(messages), 16)
    engine.add_history([engine.prompt_ids(messages) + reference])
    finished = engine.respond(messages)
    assert list(finished.token_ids) == reference and finished.stats.accepted >= 8


def test_forget_history_empties_the_suffix_index(target):
    engine = ChatEngine(
        target, None, SpeculationSettings(drafter="suffix"), SamplingSettings(max_new_tokens=16)
    )
    engine.respond([{"role": "user", "content": "Name a colour."}])
    assert engine._suffix.history_entries > 0
    engine.forget_history()
    assert engine._suffix.history_entries == 0


def test_a_quantized_copy_starts_from_its_checked_agreement_with_the_target(tiny_model_dir, target):
    """The copy's check against the float model measured how often its top-1 token is the target's:
    adaptive K starts from that, not from a coin flip. Another draft model's check says nothing
    about the target, so it starts from the default prior."""
    from engine.decoding.planner import acceptance_for
    from engine.models.pair import load_pair

    float_target, copy = load_pair(str(tiny_model_dir), None, device="cpu", quantization="int8")
    agreement = copy.info["kernel_check"]["agreement"]
    drafter = ChatEngine(float_target, copy)._model_drafter
    assert drafter.acceptance_prior == (min(agreement, 0.98),) * 2
    assert acceptance_for(drafter).conditional()[0] == pytest.approx(min(agreement, 0.98))
    assert ChatEngine(float_target, target)._model_drafter.acceptance_prior is None


def test_a_new_conversation_keeps_what_was_measured_of_the_ngram_drafter(builtin_model):
    """engine.reset() (a new conversation) empties the n-gram index but keeps the drafter, so its
    controller's measurements carry over, as the suffix index's and a model's do. A new drafter per
    conversation started unmeasured, and `auto` spent each conversation's first match on a probe."""
    engine = ChatEngine(
        builtin_model, None, SpeculationSettings(drafter="ngram"), SamplingSettings(max_new_tokens=32)
    )
    messages = [
        {"role": "user", "content": "Repeat exactly: the cat sat on the mat, the cat sat on the mat."}
    ]
    engine.respond(messages)
    ngram = engine._ngram
    [(_, controller)] = engine._planners["ngram"][1].members
    assert controller.acceptance.observations() > 0, "the n-gram drafter never drafted: no evidence"
    engine.reset()
    assert engine._ngram is ngram and ngram._seen == []
    engine.respond([{"role": "user", "content": "Something else entirely."}])
    [(drafter, kept)] = engine._planners["ngram"][1].members
    assert drafter is ngram and kept is controller
