"""Draft/target compatibility: llama.cpp's rules, padded vocabularies accepted, mismatches named."""

import copy

import pytest
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, PreTrainedTokenizerFast

from engine.errors import IncompatibleDraftError
from engine.models.compat import check_compatible, compatibility

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<extra>"]


def word_tokenizer(words: list[str], kind: str = "wordlevel") -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(SPECIALS + words)}
    if kind == "wordlevel":
        backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    else:
        backend = Tokenizer(models.BPE(vocab, merges=[], unk_token="<unk>"))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


WORDS = [f"word{i}" for i in range(300)]


def test_identical_tokenizers_are_compatible():
    ok, reason = compatibility(word_tokenizer(WORDS), word_tokenizer(WORDS))
    assert ok and reason == ""


def test_changed_token_names_the_first_differing_id():
    changed = list(WORDS)
    changed[40] = "banana"
    changed[90] = "cherry"
    with pytest.raises(IncompatibleDraftError, match=r"token id 45.*'word40'.*'banana'"):
        check_compatible(word_tokenizer(WORDS), word_tokenizer(changed))


def test_ids_below_five_are_not_compared():
    target, draft = word_tokenizer(WORDS), word_tokenizer(WORDS)
    draft.add_special_tokens({"pad_token": "<extra>"})
    assert compatibility(target, draft)[0]


def test_padded_vocabulary_within_128_is_accepted():
    draft = word_tokenizer(WORDS)
    target = word_tokenizer(WORDS + [f"pad{i}" for i in range(128)])
    assert compatibility(target, draft) == (True, "")


def test_vocabulary_sizes_more_than_128_apart_are_refused():
    target = word_tokenizer(WORDS + [f"pad{i}" for i in range(129)])
    ok, reason = compatibility(target, word_tokenizer(WORDS))
    assert not ok and "434" in reason and "305" in reason


def test_config_padding_rows_like_qwen_are_accepted():
    # Qwen2.5-7B has 152064 embedding rows, 0.5B has 151936; both tokenizers hold 151665 tokens.
    tokenizer = word_tokenizer(WORDS)
    target_config = LlamaConfig(vocab_size=len(tokenizer) + 384)
    draft_config = LlamaConfig(vocab_size=len(tokenizer) + 256)
    check_compatible(tokenizer, copy.deepcopy(tokenizer), target_config, draft_config)


def test_different_eos_is_refused():
    target, draft = word_tokenizer(WORDS), word_tokenizer(WORDS)
    draft.eos_token = "word7"
    with pytest.raises(IncompatibleDraftError, match="EOS"):
        check_compatible(target, draft)


def test_different_vocabulary_kind_is_refused():
    ok, reason = compatibility(word_tokenizer(WORDS), word_tokenizer(WORDS, kind="bpe"))
    assert not ok and "WordLevel" in reason and "BPE" in reason


def test_builtin_tokenizer_with_an_added_token(builtin_tokenizer):
    draft = copy.deepcopy(builtin_tokenizer)
    draft.add_tokens(["<|tool_call|>"])
    assert compatibility(builtin_tokenizer, draft) == (True, "")


def test_builtin_tokenizer_against_a_stranger(builtin_tokenizer):
    stranger = word_tokenizer([f"w{i}" for i in range(len(builtin_tokenizer) - len(SPECIALS))])
    ok, reason = compatibility(builtin_tokenizer, stranger)
    assert not ok


@pytest.mark.timeout(120)  # a hang guard, not a speed claim
def test_large_vocabularies_compare():
    words = [f"t{i}" for i in range(151_000)]
    target, draft = word_tokenizer(words), word_tokenizer(words[:-50] + ["x", "y"] + words[-48:])
    ok, reason = compatibility(target, draft)
    assert not ok and f"token id {151_000 - 50 + len(SPECIALS)}" in reason
