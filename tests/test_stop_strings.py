"""Stop strings end a reply before the string, and no part of one is ever streamed."""

from __future__ import annotations

import pytest

from engine.decoding.stop import StopMatcher
from engine.events import TokenSpan


def spans(*texts: str) -> list[TokenSpan]:
    return [TokenSpan(i, text, "target") for i, text in enumerate(texts)]


def stream(matcher: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    shown = ""
    for span in spans(*pieces):
        shown += "".join(s.text for s in matcher.feed([span]))
        if matcher.stopped:
            return shown, True
    return shown + "".join(s.text for s in matcher.flush()), False


def test_no_stop_strings_passes_everything_through():
    assert stream(StopMatcher(()), ["a", "b", "c"]) == ("abc", False)


def test_stop_inside_one_token_cuts_that_token():
    assert stream(StopMatcher(["END"]), ["Hello ", "wENDx", "never"]) == ("Hello w", True)


def test_stop_across_tokens_is_never_shown_in_part():
    matcher = StopMatcher(["\nUser:"])
    shown = []
    for span in spans("Hi", "\n", "Us", "er:", "more"):
        shown.append("".join(s.text for s in matcher.feed([span])))
        if matcher.stopped:
            break
    assert shown == ["Hi", "", "", ""]
    assert matcher.stopped


def test_held_text_is_released_when_it_turns_out_not_to_stop():
    assert stream(StopMatcher(["\nUser:"]), ["a", "\n", "Us", "ual"]) == ("a\nUsual", False)


def test_earliest_of_several_stops_wins():
    assert stream(StopMatcher(["cd", "b"]), ["abcd"]) == ("a", True)


@pytest.mark.parametrize("pieces", [["x", "yz"], ["xyz"], ["x", "y", "z"]])
def test_stop_at_the_very_start_gives_empty_text(pieces):
    assert stream(StopMatcher(["x"]), pieces) == ("", True)


@pytest.mark.parametrize("drafter_kind", ["none", "ngram"])
def test_generation_ends_before_a_stop_string_and_never_streams_it(make_tiny, drafter_kind):
    from engine.decoding.drafters import NgramDrafter
    from engine.decoding.planner import planner_for
    from engine.decoding.speculative import generate
    from engine.decoding.verify_cost import VerifyCostCurve
    from engine.events import TextPiece
    from engine.runtime.eager import ModelRunner
    from engine.settings import SamplingSettings, SpeculationSettings

    target = make_tiny(seed=0)
    prompt_ids = target.tokenizer(
        "The cat sat on the mat. The cat sat on the", add_special_tokens=False
    ).input_ids
    vocab = target.model.config.vocab_size

    def run(stop=()):
        drafters = [NgramDrafter(vocab, target.device)] if drafter_kind == "ngram" else []
        speculation = SpeculationSettings(k=3)
        pieces: list[str] = []
        finished = generate(
            ModelRunner(target.model),
            planner_for(drafters, speculation, VerifyCostCurve()),
            prompt_ids,
            SamplingSettings(max_new_tokens=40, stop=stop),
            speculation,
            target.eos_token_ids,
            target.tokenizer,
            lambda event: pieces.append(event.text) if isinstance(event, TextPiece) else None,
        )
        return finished, "".join(pieces)

    full, full_streamed = run()
    assert full_streamed == full.text and len(full.text) > 12
    stop = full.text[8:12]  # four characters from the middle of the reply, across tokens or not
    cut = full.text.index(stop)
    stopped, streamed = run((stop,))
    assert stopped.reason == "stop"
    assert stopped.text == full.text[:cut] == streamed
    assert list(stopped.token_ids) == list(full.token_ids[: len(stopped.token_ids)])


@pytest.mark.parametrize("end", ["eos", "stop"])
def test_counts_stop_at_the_replys_end_and_match_the_spans(make_tiny, end):
    """A reply that ends inside a round (its end token or a stop string among the accepted drafts)
    counts only the tokens it keeps: one span per token, and as many "draft" spans as accepted."""
    from engine.decoding.drafters import ModelDrafter
    from engine.decoding.planner import planner_for
    from engine.decoding.speculative import generate
    from engine.decoding.verify_cost import VerifyCostCurve
    from engine.events import TextPiece
    from engine.runtime.eager import ModelRunner
    from engine.settings import SamplingSettings, SpeculationSettings

    target = make_tiny(seed=0)
    prompt_ids = target.tokenizer("The cat sat on the mat.", add_special_tokens=False).input_ids
    vocab = target.model.config.vocab_size

    def run(eos=None, stop=()):
        spans: list = []
        drafter = ModelDrafter(ModelRunner(target.model), vocab, "self")  # the same model: all accepted
        speculation = SpeculationSettings(k=4)
        finished = generate(
            ModelRunner(target.model),
            planner_for([drafter], speculation, VerifyCostCurve()),
            prompt_ids,
            SamplingSettings(max_new_tokens=24, stop=stop),
            speculation,
            eos if eos is not None else target.eos_token_ids,
            target.tokenizer,
            lambda event: spans.extend(event.spans) if isinstance(event, TextPiece) else None,
        )
        return finished, spans

    full, _ = run()
    ids = list(full.token_ids)
    # rounds of 4 accepted drafts and a bonus token follow the first token: ids[1:6], ids[6:11], ...
    cut = next(i for i in range(7, 10) if ids[i] not in ids[:i])  # mid-round, first of its kind
    if end == "eos":
        finished, spans = run(eos={ids[cut]})
    else:
        text = target.tokenizer.decode(ids[cut : cut + 1])
        if not text.strip() or text in target.tokenizer.decode(ids[:cut]):
            pytest.skip("that token's text is not a usable stop string")
        finished, spans = run(stop=(text,))
    stats = finished.stats
    assert len(finished.token_ids) < len(ids)
    assert len(spans) == stats.generated_tokens == len(finished.token_ids)
    assert sum(span.provenance == "draft" for span in spans) == stats.accepted
    assert 1 + sum(stats.accepted_lengths) == stats.generated_tokens
    assert stats.accepted <= stats.drafted
