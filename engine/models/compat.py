"""Can this draft propose tokens for this target? Checked once, when the pair is chosen.

The rules follow llama.cpp's speculative decoding: the same kind of vocabulary, the same BOS and
EOS tokens, vocabulary sizes within 128 of each other, and identical token text for every id from 5
up to the smaller vocabulary. Embedding rows beyond the tokenizer (padding such as Qwen2.5-0.5B's
151936 against 7B's 152064) are not tokens and are not compared.
"""

from __future__ import annotations

from engine.errors import IncompatibleDraftError

MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_COMPARED_ID = 5


def vocabulary_kind(tokenizer) -> str:
    """The tokenizer algorithm, e.g. 'BPE', 'Unigram', 'WordPiece' ('' if it cannot be told)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = getattr(backend, "model", None)
    return type(model).__name__ if model is not None else ""


def _token_texts(tokenizer, count: int) -> list[str | None]:
    return tokenizer.convert_ids_to_tokens(list(range(count)))


def _first_difference(a: list, b: list, start: int) -> int | None:
    if a[start:] == b[start:]:
        return None
    return next(i for i in range(start, len(a)) if a[i] != b[i])


def _special_tokens(tokenizer) -> dict[str, tuple[str | None, int | None]]:
    return {
        role: (getattr(tokenizer, f"{role}_token", None), getattr(tokenizer, f"{role}_token_id", None))
        for role in ("bos", "eos")
    }


def _config_vocab(config) -> int | None:
    config = getattr(config, "text_config", None) or config
    return getattr(config, "vocab_size", None) if config is not None else None


def check_compatible(target_tokenizer, draft_tokenizer, target_config=None, draft_config=None) -> None:
    """Raise IncompatibleDraftError, naming what differs, unless the draft can serve the target."""
    target_kind, draft_kind = vocabulary_kind(target_tokenizer), vocabulary_kind(draft_tokenizer)
    if target_kind and draft_kind and target_kind != draft_kind:
        raise IncompatibleDraftError(
            f"The draft's vocabulary is {draft_kind} but the target's is {target_kind}: "
            "choose a draft from the target's model family."
        )

    target_special, draft_special = _special_tokens(target_tokenizer), _special_tokens(draft_tokenizer)
    for role in ("bos", "eos"):
        if target_special[role] != draft_special[role]:
            raise IncompatibleDraftError(
                f"The draft's {role.upper()} token {draft_special[role]} differs from the target's "
                f"{target_special[role]}: choose a draft from the target's model family."
            )
    for flag in ("add_bos_token", "add_eos_token"):
        target_flag, draft_flag = getattr(target_tokenizer, flag, None), getattr(draft_tokenizer, flag, None)
        if target_flag is not None and draft_flag is not None and target_flag != draft_flag:
            raise IncompatibleDraftError(
                f"The draft's tokenizer sets {flag}={draft_flag} but the target's sets {target_flag}."
            )

    target_size, draft_size = len(target_tokenizer), len(draft_tokenizer)
    if abs(target_size - draft_size) > MAX_VOCAB_SIZE_DIFFERENCE:
        raise IncompatibleDraftError(
            f"The vocabularies differ too much in size: the target has {target_size} tokens and the draft "
            f"{draft_size} (at most {MAX_VOCAB_SIZE_DIFFERENCE} apart is allowed)."
        )

    target_rows, draft_rows = _config_vocab(target_config), _config_vocab(draft_config)
    if target_rows and draft_rows and abs(target_rows - draft_rows) > MAX_VOCAB_SIZE_DIFFERENCE:
        raise IncompatibleDraftError(
            f"The draft's output layer has {draft_rows} tokens and the target's {target_rows} (at most "
            f"{MAX_VOCAB_SIZE_DIFFERENCE} apart is allowed): a draft model must use the target's tokenizer."
        )

    # Ids a model cannot emit (beyond its embedding rows) cannot disagree, so they are not compared.
    shared = min(target_size, draft_size)
    for config in (target_config, draft_config):
        rows = _config_vocab(config)
        if rows is not None:
            shared = min(shared, rows)
    target_texts, draft_texts = _token_texts(target_tokenizer, shared), _token_texts(draft_tokenizer, shared)
    token_id = _first_difference(target_texts, draft_texts, FIRST_COMPARED_ID)
    if token_id is not None:
        raise IncompatibleDraftError(
            f"The tokenizers differ at token id {token_id}: the target has {target_texts[token_id]!r} "
            f"and the draft {draft_texts[token_id]!r}. Choose a draft that shares the target's tokenizer."
        )


def compatibility(
    target_tokenizer, draft_tokenizer, target_config=None, draft_config=None
) -> tuple[bool, str]:
    """(ok, reason) for lists in the UI; reason is '' when ok."""
    try:
        check_compatible(target_tokenizer, draft_tokenizer, target_config, draft_config)
    except IncompatibleDraftError as exc:
        return False, str(exc)
    return True, ""
