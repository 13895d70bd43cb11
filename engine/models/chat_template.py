"""The one way Tandem turns chat messages into prompt ids, for the chat, the server and the benchmark.

Only the chat template places control tokens. A message's text is read as plain text: `<|im_start|>`
typed into a message is the characters `<`, `|`, `im`, ... and never the token that opens a turn,
so a message cannot close itself and open a `system` turn (llama.cpp's server and vLLM can be set
to tokenize so too). A message without a control token's text is tokenized exactly as the whole
rendered prompt always was; one with such text is rendered with a marker in its place, the prompt is
cut at the control tokens the template placed, and each piece between them is tokenized with the
markers turned back into their text and special-token splitting off. For byte-level BPE tokenizers
(SmolLM2, Llama 3, Qwen, Phi-3) those pieces give the one call's ids; a SentencePiece tokenizer that
marks only its first word may read a piece after a control token with a word mark.
"""

from __future__ import annotations

import re

# Private-use characters: a control token's text inside a message is rendered as MARK_OPEN, its index
# in the list of such texts, MARK_CLOSE; the template never writes these.
MARK_OPEN, MARK_CLOSE = "\ue000", "\ue001"


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The tokenizer's chat template with the generation prompt added; a plain transcript for a base
    model without a template. Control tokens come from the template alone."""
    controls = control_texts(tokenizer)
    pattern = re.compile("|".join(re.escape(text) for text in controls)) if controls else None
    forged = pattern is not None and any(
        isinstance(m.get("content"), str) and pattern.search(m["content"]) for m in messages
    )
    if not forged:
        return list(tokenizer(render(tokenizer, messages), add_special_tokens=False).input_ids)
    return pieces_ids(tokenizer, messages, controls)


def pieces_ids(tokenizer, messages: list[dict], controls: list[str]) -> list[int]:
    """The prompt cut at the control tokens the template placed, each piece between them tokenized as
    plain text: the texts in `controls` inside a message are hidden behind markers while rendering."""
    pattern = re.compile("|".join(re.escape(text) for text in controls))
    hidden: list[str] = []

    def hide(match: re.Match) -> str:
        hidden.append(match.group(0))
        return f"{MARK_OPEN}{len(hidden) - 1}{MARK_CLOSE}"

    masked = [
        {**m, "content": pattern.sub(hide, m["content"])} if isinstance(m.get("content"), str) else m
        for m in messages
    ]
    text = render(tokenizer, masked)
    marker = re.compile(f"{MARK_OPEN}(\\d+){MARK_CLOSE}")
    ids: list[int] = []
    for piece in re.split(f"({pattern.pattern})", text):
        if piece in controls:  # placed by the template
            ids.append(tokenizer.convert_tokens_to_ids(piece))
        elif piece:
            plain = marker.sub(lambda match: hidden[int(match.group(1))], piece)
            ids += tokenizer(plain, add_special_tokens=False, split_special_tokens=True).input_ids
    return ids


def render(tokenizer, messages: list[dict]) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages) + "Assistant:"


def control_texts(tokenizer) -> list[str]:
    """The texts the tokenizer reads as special tokens, longest first (so the longest one matches)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts = {token.content for token in added.values() if getattr(token, "special", False) and token.content}
    return sorted(texts, key=len, reverse=True)
