"""The suffix index: drafting from this conversation and earlier ones, by frequency and match length."""

from __future__ import annotations

import torch

from engine.decoding.drafters import SuffixDrafter
from engine.settings import SamplingSettings

V = 100


def drafter(**options) -> SuffixDrafter:
    suffix = SuffixDrafter(V, torch.device("cpu"), **options)
    suffix.begin(SamplingSettings(), None)
    return suffix


def draft(suffix, context, k=8) -> list[int]:
    return suffix.propose(context, k).tokens.tolist()


def test_drafts_the_continuation_of_an_earlier_conversation():
    suffix = drafter(history=[[1, 2, 3, 4, 5, 6, 7]])
    assert draft(suffix, [40, 41, 3, 4]) == [5, 6, 7]
    peek = suffix.peek([40, 41, 3, 4])
    assert peek.available == 3 and peek.condition == 2  # matched on two tokens


def test_the_most_frequent_continuation_wins():
    suffix = drafter(history=[[1, 2, 3, 7, 50], [1, 2, 3, 7, 50], [1, 2, 3, 8, 60]])
    assert draft(suffix, [9, 2, 3])[:2] == [7, 50]


def test_a_longer_match_beats_a_more_frequent_short_one():
    suffix = drafter(history=[[5, 2, 3, 9]] * 3 + [[6, 2, 3, 8]])
    assert draft(suffix, [6, 2, 3], k=1) == [8]  # "6 2 3" seen once, "2 3" mostly followed by 9
    assert draft(suffix, [7, 2, 3], k=1) == [9]


def test_this_conversation_weighs_more_than_history():
    suffix = drafter(history=[[1, 2, 3, 10]])
    assert draft(suffix, [1, 2, 3, 11, 20, 1, 2, 3], k=1) == [11]


def test_stops_where_the_continuation_is_uncertain():
    suffix = drafter(history=[[1, 2, 3, 4, 5], [7, 4, 5, 80], [8, 4, 5, 81], [9, 4, 5, 82], [6, 4, 5, 83]])
    # after "2 3 4 5" the longest match is "4 5" (via "3 4 5"? no: "3 4 5" is followed by nothing),
    # whose followers are spread over four tokens: below min_confidence, so the draft stops
    assert draft(suffix, [1, 2, 3]) == [4, 5]


def test_nothing_known_gives_an_empty_draft():
    suffix = drafter()
    assert draft(suffix, [1, 2, 3]) == []
    assert suffix.peek([1, 2, 3]).available == 0


def test_memory_is_bounded():
    suffix = drafter(max_entries=50, max_followers=2)
    suffix.add_history(list(range(1000)))
    assert suffix.history_entries <= 50
    for token in range(10):  # one n-gram with many different followers keeps only two
        suffix.add_history([1, 2, token])
    assert len(suffix._history[(1, 2)]) <= 2


def test_the_current_context_is_indexed_incrementally_and_replaced_when_it_changes():
    suffix = drafter()
    context = [1, 2, 3, 4, 1, 2]
    assert draft(suffix, context, k=4) == [3, 4, 1, 2]
    context += [3, 9, 1, 2, 3]
    assert draft(suffix, context, k=1) in ([4], [9])
    # a new conversation: the old one is not local any more
    assert draft(suffix, [50, 51, 52, 50, 51], k=2) == [52, 50]
    assert (1, 2) not in suffix._local


def test_reset_keeps_history():
    suffix = drafter(history=[[1, 2, 3, 4]])
    draft(suffix, [5, 6, 5])
    suffix.reset()
    assert draft(suffix, [9, 2, 3]) == [4]
    suffix.forget_history()
    assert draft(suffix, [9, 2, 3]) == []


def test_sampled_drafts_carry_their_one_hot_distributions():
    suffix = drafter(history=[[1, 2, 3, 4]])
    suffix.begin(SamplingSettings(temperature=1.0), None)
    proposal = suffix.propose([9, 2, 3], 4)
    assert proposal.probs.shape == (1, V) and proposal.probs[0, 4] == 1.0
