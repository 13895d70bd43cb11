"""The speculative loop on tiny random models: exact greedy output, cache invariants, cancel, limits."""

from __future__ import annotations

import threading

import pytest
import torch

from engine.decoding.drafters import ModelDrafter, NgramDrafter, SuffixDrafter
from engine.decoding.planner import planner_for
from engine.decoding.speculative import generate, speculative_round
from engine.decoding.verify_cost import VerifyCostCurve
from engine.events import RoundStats, TextPiece
from engine.runtime.eager import ModelRunner
from engine.settings import SamplingSettings, SpeculationSettings

NEW_TOKENS = 40
PROMPT = "The cat sat on the mat. The dog sat on the log. The cat sat on the"


@pytest.fixture(scope="module")
def other_draft(make_tiny):
    return make_tiny(seed=1, layers=1)


@pytest.fixture(scope="module")
def prompt_ids(target):
    return target.tokenizer(PROMPT, add_special_tokens=False).input_ids


@pytest.fixture(scope="module")
def reference(target, prompt_ids):
    """Plain greedy decoding by transformers."""
    output = target.model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        eos_token_id=list(target.eos_token_ids),
    )
    return output[0, len(prompt_ids) :].tolist()


def make_drafter(kind, target, other_draft):
    """One drafter, or a list of them: several for "auto", none for "none" (plain decoding)."""
    vocab = target.model.config.vocab_size
    if kind == "self":
        return ModelDrafter(ModelRunner(target.model), vocab, "self")
    if kind == "other":
        return ModelDrafter(ModelRunner(other_draft.model), vocab, "other")
    if kind == "ngram":
        return NgramDrafter(vocab, target.device)
    if kind == "suffix":
        return SuffixDrafter(vocab, target.device)
    if kind == "auto":
        return [make_drafter(name, target, other_draft) for name in ("ngram", "suffix", "other")]
    return []


def planned(drafters, speculation):
    """A fresh planner over a drafter, or a list of them."""
    return planner_for(drafters if isinstance(drafters, list) else [drafters], speculation, VerifyCostCurve())


def run(target, drafter, prompt_ids, k=None, sampling=None, on_event=None, cancel=None, runner=None):
    sampling = sampling or SamplingSettings(max_new_tokens=NEW_TOKENS)
    runner = runner or ModelRunner(target.model)
    speculation = SpeculationSettings(k=k)
    return generate(
        runner,
        planned(drafter, speculation),
        prompt_ids,
        sampling,
        speculation,
        target.eos_token_ids,
        target.tokenizer,
        on_event,
        cancel,
    )


def assert_greedy_equal(model, prompt_ids, ours, reference):
    """Token for token; where they differ, the target's top two scores must tie (1e-5) at that position."""
    if ours == reference:
        return
    first = next(i for i, (a, b) in enumerate(zip(ours, reference, strict=False)) if a != b)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + reference[:first]])).logits[0, -1]
    top2 = logits.topk(2).values
    assert (top2[0] - top2[1]).abs() < 1e-5, f"differs at token {first}: {ours[first]} vs {reference[first]}"


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("kind", ["other", "self", "ngram"])
def test_greedy_output_equals_plain_generate(kind, k, target, other_draft, prompt_ids, reference):
    finished = run(target, make_drafter(kind, target, other_draft), prompt_ids, k=k)
    assert_greedy_equal(target.model, prompt_ids, list(finished.token_ids), reference)
    if kind == "self":
        assert finished.stats.acceptance_rate == 1.0
        assert finished.stats.drafted > 0


@pytest.mark.parametrize("kind", ["none", "ngram", "suffix", "auto", "self", "other"])
def test_adaptive_k_and_plain_also_equal_greedy(kind, target, other_draft, prompt_ids, reference):
    finished = run(target, make_drafter(kind, target, other_draft), prompt_ids, k=None)
    assert_greedy_equal(target.model, prompt_ids, list(finished.token_ids), reference)
    names = {"none": "none", "ngram": "ngram", "suffix": "suffix", "auto": "auto"}
    assert finished.stats.drafter == names.get(kind, f"model:{kind}")
    allowed = (
        {"none", "ngram", "suffix", "model:other"} if kind == "auto" else {"none", finished.stats.drafter}
    )
    assert set(finished.stats.drafter_history) <= allowed
    assert len(finished.stats.drafter_history) == finished.stats.rounds


@pytest.mark.parametrize("kind", ["other", "ngram"])
def test_cache_holds_prompt_plus_accepted_after_every_round(kind, target, other_draft, prompt_ids):
    runner = ModelRunner(target.model)
    drafter = make_drafter(kind, target, other_draft)
    checked = []

    def check(event):
        if isinstance(event, RoundStats):
            # the last token of the context is fed at the start of the next round
            assert runner.cache_length == len(prompt_ids) + event.stats.generated_tokens - 1
            if isinstance(drafter, ModelDrafter):
                assert drafter.runner.cache_length == len(drafter.cached_tokens)
            checked.append(event.stats.rounds)

    run(target, drafter, prompt_ids, k=4, on_event=check, runner=runner)
    assert len(checked) > 5


def test_provenance_and_stats_add_up(target, prompt_ids):
    pieces = []
    finished = run(target, make_drafter("self", target, None), prompt_ids, k=3, on_event=pieces.append)
    spans = [span for event in pieces if isinstance(event, TextPiece) for span in event.spans]
    assert [span.token_id for span in spans] == list(finished.token_ids)
    assert spans[0].provenance == "target"  # from the prefill
    assert {span.provenance for span in spans[1:]} <= {"draft", "bonus"}
    stats = finished.stats
    assert stats.accepted == sum(span.provenance == "draft" for span in spans)
    assert sum(stats.accepted_lengths) == stats.generated_tokens - 1
    assert stats.per_position_acceptance()[:3] == [1.0, 1.0, 1.0]
    assert stats.ttft_s is not None and stats.verify_time_s > 0 and stats.draft_time_s > 0


def test_sampling_with_draft_equal_to_target_accepts_everything(target, prompt_ids):
    sampling = SamplingSettings(temperature=0.9, top_k=40, top_p=0.95, max_new_tokens=30, seed=3)
    finished = run(target, make_drafter("self", target, None), prompt_ids, k=4, sampling=sampling)
    assert finished.stats.acceptance_rate == 1.0


def test_seeded_sampling_repeats_under_any_k_and_any_drafter(target, other_draft, prompt_ids):
    """Seeded sampling draws its noise per context index (sampling.coupled_accept): the reply is the
    target's own seeded sample, whatever K each round used and whichever drafter drafted."""
    sampling = SamplingSettings(temperature=1.0, top_k=50, max_new_tokens=24, seed=77)
    outputs = {
        (kind, k): run(
            target, make_drafter(kind, target, other_draft), prompt_ids, k=k, sampling=sampling
        ).token_ids
        for kind, k in [
            ("none", None),
            ("other", 1),
            ("other", 4),
            ("other", None),
            ("ngram", 3),
            ("auto", None),
            ("self", 6),
        ]
    }
    assert len(set(outputs.values())) == 1, outputs


@pytest.mark.parametrize("kind", ["other", "ngram"])
def test_seeded_sampling_repeats_exactly(kind, target, other_draft, prompt_ids):
    sampling = SamplingSettings(temperature=1.0, top_k=50, max_new_tokens=10, seed=1234)
    outputs = {
        run(target, make_drafter(kind, target, other_draft), prompt_ids, k=3, sampling=sampling).token_ids
        for _ in range(20)
    }
    assert len(outputs) == 1
    sampling.seed = 99
    assert (
        run(target, make_drafter(kind, target, other_draft), prompt_ids, k=3, sampling=sampling).token_ids
        not in outputs
    )


def test_cancel_from_the_callback_stops_before_the_next_round(target, other_draft, prompt_ids, reference):
    cancel = threading.Event()
    pieces = []

    def on_event(event):
        if isinstance(event, TextPiece):
            pieces.append(event)
            if len(pieces) == 3:
                cancel.set()

    runner = ModelRunner(target.model)
    drafter = make_drafter("other", target, other_draft)
    finished = run(target, drafter, prompt_ids, k=4, on_event=on_event, cancel=cancel, runner=runner)
    assert finished.reason == "cancelled" and len(pieces) == 3
    # the caches stay usable: continue from the prompt, reusing what the target cached
    runner.rollback(min(runner.cache_length, len(prompt_ids)))
    again = run(target, drafter, prompt_ids, k=4, runner=runner)
    assert_greedy_equal(target.model, prompt_ids, list(again.token_ids), reference)


def test_cancel_from_another_thread_takes_effect_within_one_forward(target, prompt_ids):
    """Cancel lands between forwards: after it is set, at most the forward in flight completes."""
    runner = ModelRunner(target.model)
    forwards_after_cancel = []
    cancel = threading.Event()
    original = runner.forward

    def counting_forward(ids):
        if cancel.is_set():
            forwards_after_cancel.append(1)
        return original(ids)

    runner.forward = counting_forward
    drafter = make_drafter("self", target, None)
    timer = threading.Timer(0.2, cancel.set)
    timer.start()
    finished = run(
        target,
        drafter,
        prompt_ids,
        k=4,
        sampling=SamplingSettings(max_new_tokens=100_000),
        cancel=cancel,
        runner=runner,
    )
    timer.join()
    assert finished.reason == "cancelled"
    assert len(forwards_after_cancel) <= 1


def test_stops_at_the_end_of_the_context(target, other_draft):
    context_length = target.model.config.max_position_embeddings
    prompt_ids = [100 + i % 50 for i in range(context_length - 5)]
    finished = run(
        target,
        make_drafter("other", target, other_draft),
        prompt_ids,
        k=8,
        sampling=SamplingSettings(max_new_tokens=50),
    )
    assert finished.reason in ("max_tokens", "eos")
    assert len(prompt_ids) + len(finished.token_ids) <= context_length


def test_max_new_tokens_is_exact_with_long_drafts(target, prompt_ids):
    for limit in (1, 2, 5, 9):
        finished = run(
            target,
            make_drafter("self", target, None),
            prompt_ids,
            k=8,
            sampling=SamplingSettings(max_new_tokens=limit),
        )
        assert len(finished.token_ids) == limit or finished.reason == "eos"


@pytest.mark.slow
def test_acceptance_does_not_decay_over_512_tokens_on_the_builtin_model(builtin_model):
    """Draft = target with K = 8 on SmolLM2: every drafted token is accepted, early and late."""
    tokenizer = builtin_model.tokenizer
    prompt_ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    prompt_ids = tokenizer(prompt_ids, add_special_tokens=False).input_ids
    runner = ModelRunner(builtin_model.model)
    drafter = ModelDrafter(ModelRunner(builtin_model.model), runner.vocab_size, "self")
    spans = []
    speculation = SpeculationSettings(k=8)
    finished = generate(
        runner,
        planned(drafter, speculation),
        prompt_ids,
        SamplingSettings(max_new_tokens=512),
        speculation,
        set(),
        tokenizer,
        lambda e: spans.extend(e.spans) if isinstance(e, TextPiece) else None,
    )
    assert len(finished.token_ids) == 512
    assert runner.cache_length == len(prompt_ids) + 511
    first, last = spans[1:129], spans[-128:]
    # "target" tokens mark rejections; the bonus/draft split only depends on where rounds end
    assert sum(span.provenance == "target" for span in first) == 0
    assert sum(span.provenance == "target" for span in last) == 0
    assert finished.stats.acceptance_rate == 1.0


def test_the_draft_reads_the_prompt_before_drafting_starts(target, other_draft, prompt_ids):
    """Prompt reading is prompt processing: the first round's draft time must not include it,
    or a long prompt makes drafting look too expensive for adaptive K."""
    drafter = make_drafter("other", target, other_draft)
    forwards_in_rounds = []

    def on_event(event):
        if isinstance(event, TextPiece) and not forwards_in_rounds:
            forwards_in_rounds.append(drafter.runner.cache_length)

    original_propose = drafter.propose

    def propose(context, k):
        # at the first proposal the draft cache already holds the whole prompt
        forwards_in_rounds.append(drafter.runner.cache_length)
        return original_propose(context, k)

    drafter.propose = propose
    run(target, drafter, prompt_ids, k=4, sampling=SamplingSettings(max_new_tokens=6), on_event=on_event)
    assert forwards_in_rounds[0] == 0  # nothing read when the first token (from the prefill) streams
    assert forwards_in_rounds[1] == len(prompt_ids)


def test_catching_up_after_plain_rounds_is_not_priced_as_drafting(target, other_draft, prompt_ids):
    """After plain rounds the draft must read the tokens it skipped; that one-off cost is reported
    apart, so that adaptive K does not judge drafting by it and never come back."""
    drafter = make_drafter("other", target, other_draft)
    drafter.begin(SamplingSettings(), None)
    draft = drafter.propose(prompt_ids, 2)
    drafter.update([])
    assert draft.catch_up_s > 0  # read the whole prompt
    draft = drafter.propose(prompt_ids + [5], 2)  # the usual round: one new token
    drafter.update([])
    assert draft.catch_up_s == 0.0
    draft = drafter.propose(prompt_ids + [5, 6, 7, 8, 9, 10], 2)  # five plain rounds were skipped
    assert draft.catch_up_s > 0


def test_a_losing_draft_model_reads_the_next_prompt_only_when_it_drafts(
    target, other_draft, prompt_ids, reference
):
    """A planner that decodes plainly (the draft loses here) skips the draft's prompt read; a probe
    catches it up, and the output stays the target's."""
    drafter = make_drafter("other", target, other_draft)
    curve = VerifyCostCurve()
    curve.replace({1: 0.01, 2: 0.011, 5: 0.012})
    planner = planner_for([drafter], SpeculationSettings(), curve)
    controller = planner.members[0][1]
    controller.draft_step_s, planner.plain = 1.0, True  # a draft far too slow: plain, a probe in 32 rounds
    read, prefill = [], drafter.prefill
    drafter.prefill = lambda context: (read.append(len(context)), prefill(context))
    sampling = SamplingSettings(max_new_tokens=NEW_TOKENS)
    finished = generate(
        ModelRunner(target.model),
        planner,
        prompt_ids,
        sampling,
        SpeculationSettings(),
        target.eos_token_ids,
        target.tokenizer,
    )
    assert list(finished.token_ids) == reference
    assert read == []  # the prompt was not read up front
    assert 0 < sum(k > 0 for k in finished.stats.k_history) <= 2  # the probe caught it up


def test_padded_verify_gives_the_same_round(target, other_draft, prompt_ids):
    """A verify forward padded to a larger size (cheaper on some machines) accepts the same tokens
    and leaves the cache holding context + accepted, as an unpadded one."""
    results = []
    for size in (None, 9):
        runner = ModelRunner(target.model)
        runner.prefill(prompt_ids[:-1])
        drafter = make_drafter("other", target, other_draft)
        drafter.begin(SamplingSettings(), None)
        result = speculative_round(
            runner, drafter, prompt_ids, 4, SamplingSettings(), None, None, verify_size=size
        )
        assert runner.cache_length == len(prompt_ids) + result.num_accepted
        results.append((result.tokens, result.verify_size))
    assert results[0][0] == results[1][0]
    assert [size for _, size in results] == [5, 9]


# --- the draft model on another device, vocabulary widths, p_min -----------------------------------


class _OtherDeviceGenerator:
    """Stands for the request's generator on the target's device when the draft runs elsewhere
    (a CUDA generator cannot be made on a machine without CUDA)."""

    device = torch.device("meta")

    def initial_seed(self):
        return 41


def test_model_draft_lands_on_the_target_device_with_its_own_generator(target, other_draft, prompt_ids):
    vocab = target.model.config.vocab_size
    drafter = ModelDrafter(ModelRunner(other_draft.model), vocab, "other", target_device="meta")
    drafter.begin(SamplingSettings(temperature=1.0, seed=3), _OtherDeviceGenerator())
    assert isinstance(drafter.generator, torch.Generator)
    assert drafter.generator.device == drafter.runner.device
    assert drafter.generator.initial_seed() == 42
    draft = drafter.propose(prompt_ids, 3)
    assert draft.tokens.device.type == "meta" and draft.probs.device.type == "meta"
    assert drafter.propose(prompt_ids, 0).tokens.device.type == "meta"
    same_device = torch.Generator().manual_seed(5)
    drafter.begin(SamplingSettings(temperature=1.0), same_device)
    assert drafter.generator is same_device


def test_a_wider_draft_vocabulary_is_cut_and_renormalised(target, other_draft):
    vocab = target.model.config.vocab_size
    drafter = ModelDrafter(ModelRunner(other_draft.model), vocab - 3, "other")
    probs = torch.full((2, vocab), 1.0 / vocab)
    probs[:, -3:] = 0.2  # mass on the rows the target does not have
    probs /= probs.sum(-1, keepdim=True)
    cut = drafter._target_width(probs)
    assert cut.shape == (2, vocab - 3)
    assert torch.allclose(cut.sum(-1), torch.ones(2))


def _early_stop_case(drafter, prompt_ids, k):
    """(context, p_min) at which this draft stops after at least one token and before k: the draft's
    confidence at each step is read with p_min off, then p_min is put between two of them."""
    for end in range(len(prompt_ids), 2, -1):
        context = prompt_ids[:end]
        drafter.reset()
        drafter.begin(SamplingSettings(), None)
        confidences = []
        logits = drafter._catch_up(context)
        for _ in range(k):
            confidences.append(drafter._confidence(logits))
            logits = drafter.runner.forward(logits[: drafter.target_vocab_size].argmax().view(1))[-1]
        later = min(confidences[1:])
        if confidences[0] > later:
            drafter.reset()
            return context, (confidences[0] + later) / 2
    pytest.fail("no context where p_min stops this draft early")


def test_p_min_stop_keeps_every_cached_draft_token(target, other_draft, prompt_ids):
    """When p_min stops the draft early, every drafted token was fed to the draft's cache; accepting
    them all must keep them all (the last one used to be thrown away and read again)."""
    vocab = target.model.config.vocab_size
    drafter = ModelDrafter(ModelRunner(other_draft.model), vocab, "other")
    context, p_min = _early_stop_case(drafter, prompt_ids, 6)
    drafter.begin(SamplingSettings(), None, None, p_min)
    draft = drafter.propose(context, 6)
    assert 0 < len(draft) < 6
    accepted = draft.tokens.tolist()
    drafter.update(accepted)
    assert drafter.cached_tokens == context + accepted
    assert drafter.runner.cache_length == len(drafter.cached_tokens)


def test_p_min_keeps_greedy_output_exact(target, other_draft, prompt_ids, reference):
    vocab = target.model.config.vocab_size
    drafter = ModelDrafter(ModelRunner(other_draft.model), vocab, "other")
    _, p_min = _early_stop_case(drafter, prompt_ids, 6)
    speculation = SpeculationSettings(k=6, p_min=p_min)
    finished = generate(
        ModelRunner(target.model),
        planned(drafter, speculation),
        prompt_ids,
        SamplingSettings(max_new_tokens=NEW_TOKENS),
        speculation,
        target.eos_token_ids,
        target.tokenizer,
    )
    assert_greedy_equal(target.model, prompt_ids, list(finished.token_ids), reference)
    assert max(finished.stats.per_position_drafted[:1] or [0]) > 0


def test_suffix_drafter_with_history_drafts_the_earlier_reply_and_stays_exact(
    target, other_draft, prompt_ids, reference
):
    """A reply seen before (the history holds it): most of it is drafted and accepted, and the
    output is still the target's."""
    drafter = SuffixDrafter(target.model.config.vocab_size, target.device, history=[prompt_ids + reference])
    finished = run(target, drafter, prompt_ids, k=None)
    assert_greedy_equal(target.model, prompt_ids, list(finished.token_ids), reference)
    assert finished.stats.accepted >= NEW_TOKENS // 2


# --- a long prompt's reading, reported chunk by chunk --------------------------------------------


def test_a_prompt_of_several_chunks_reports_its_reading_and_a_short_one_nothing(target, monkeypatch):
    """PrefillProgress once before the first chunk (no time estimate yet), then after every chunk,
    `read` rising to the total; the reply is the same with or without a listener."""
    from engine.decoding import speculative
    from engine.events import PrefillProgress

    monkeypatch.setattr(speculative, "PREFILL_CHUNK", 16)
    long_prompt = target.tokenizer(PROMPT * 3, add_special_tokens=False).input_ids
    assert len(long_prompt) > 2 * 16
    sampling = SamplingSettings(max_new_tokens=8)
    events = []
    finished = run(target, [], long_prompt, sampling=sampling, on_event=events.append)
    reading = [event for event in events if isinstance(event, PrefillProgress)]
    reads = [event.read for event in reading]
    assert reads == sorted(set(reads)) and reads[0] == 0 and reads[-1] == len(long_prompt)
    assert len(reading) == -(-len(long_prompt) // 16) + 1  # one before the first chunk, one after each
    assert {(event.total, event.prompt_tokens) for event in reading} == {(len(long_prompt), len(long_prompt))}
    assert reading[0].seconds_left is None
    assert all(event.seconds_left is not None and event.seconds_left >= 0 for event in reading[1:])
    assert reading[-1].seconds_left == 0
    assert events.index(reading[-1]) < next(i for i, e in enumerate(events) if isinstance(e, TextPiece))
    assert finished.token_ids == run(target, [], long_prompt, sampling=sampling).token_ids

    short = long_prompt[:16]
    events = []
    run(target, [], short, sampling=sampling, on_event=events.append)
    assert not any(isinstance(event, PrefillProgress) for event in events)


def test_reading_counts_only_the_prompt_tokens_not_cached(target, monkeypatch):
    from engine.decoding import speculative
    from engine.events import PrefillProgress

    monkeypatch.setattr(speculative, "PREFILL_CHUNK", 16)
    prompt = target.tokenizer(PROMPT * 3, add_special_tokens=False).input_ids
    runner = ModelRunner(target.model)
    runner.prefill(prompt[:20])  # an earlier turn left the first 20 tokens in the cache
    events = []
    run(
        target, [], prompt, sampling=SamplingSettings(max_new_tokens=2), on_event=events.append, runner=runner
    )
    reading = [event for event in events if isinstance(event, PrefillProgress)]
    assert reading[-1].read == reading[-1].total == len(prompt) - 20
    assert reading[-1].prompt_tokens == len(prompt)


def test_the_reading_is_worded_with_the_time_left():
    from engine.events import PrefillProgress

    assert PrefillProgress(0, 6129, None, 6129).summary() == "0 of 6,129 tokens"
    assert PrefillProgress(1536, 6129, 39.6, 6129).summary() == "1,536 of 6,129 tokens · about 40 s left"
    assert PrefillProgress(512, 6129, 150, 6200).summary() == "512 of 6,129 tokens · about 2 min left"
    assert PrefillProgress(6129, 6129, 0.0, 6129).summary() == "6,129 of 6,129 tokens"
