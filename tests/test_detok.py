"""Streamed text equals the final decode, for multi-byte characters and merging tokens."""

from __future__ import annotations

import random

import pytest

from engine.decoding.detok import IncrementalDetokenizer

TEXTS = [
    "Hello, world! 🙂 How are you?",
    "你好，世界。今天天气很好。",
    "Emoji chains: 👩‍👩‍👧‍👦 🇫🇷 and accents: café, naïve, Ærøskøbing.",
    "日本語とEnglishを混ぜる 🎉🎉 done",
    "  leading spaces,\ttabs\nand newlines\n\n",
]


def stream(tokenizer, ids):
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add(token_id) for token_id in ids]
    pieces.append(detok.finish())
    return pieces, detok.text


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_decode(builtin_tokenizer, text):
    ids = builtin_tokenizer(text, add_special_tokens=False).input_ids
    pieces, final = stream(builtin_tokenizer, ids)
    assert "".join(pieces) == final == builtin_tokenizer.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_special_tokens_are_not_text(builtin_tokenizer):
    ids = builtin_tokenizer("Done.", add_special_tokens=False).input_ids + [builtin_tokenizer.eos_token_id]
    pieces, final = stream(builtin_tokenizer, ids)
    assert final == "Done." and pieces[-2] == ""


def test_random_token_sequences(builtin_tokenizer):
    """Random ids often cut characters in the middle; the pieces must still add up."""
    rng = random.Random(0)
    for _ in range(30):
        ids = [rng.randrange(len(builtin_tokenizer)) for _ in range(40)]
        pieces, final = stream(builtin_tokenizer, ids)
        assert "".join(pieces) == final == builtin_tokenizer.decode(ids, skip_special_tokens=True)
