"""The one way Tandem turns chat messages into prompt ids, for the chat, the server and the benchmark."""

from __future__ import annotations


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The tokenizer's chat template with the generation prompt added; a plain transcript for a base
    model without a template."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages) + "Assistant:"
    return list(tokenizer(text, add_special_tokens=False).input_ids)
