"""Incremental detokenization: the text each new token adds, such that the pieces joined equal
`tokenizer.decode(all_ids, skip_special_tokens=True)`.

A token can end inside a multi-byte character (emoji, CJK under byte-level BPE) and some tokenizers
change earlier text when a token is appended, so a token is never decoded alone. We decode a short
window that starts a few tokens back and emit only what the window adds beyond its older part; text
ending in U+FFFD (an incomplete character) is held back until the character completes.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
WINDOW = 6  # tokens of left context in each decode


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""  # everything emitted so far
        self._prefix_offset = 0  # window start
        self._read_offset = 0  # first token whose text is not emitted yet

    def add(self, token_id: int) -> str:
        """Appends one token; returns the text it completes ('' while a character is incomplete)."""
        self.ids.append(token_id)
        older = self._decode(self.ids[self._prefix_offset : self._read_offset])
        window = self._decode(self.ids[self._prefix_offset :])
        if len(window) <= len(older) or window.endswith(REPLACEMENT) or not window.startswith(older):
            return ""
        piece = window[len(older) :]
        self.text += piece
        self._prefix_offset = max(self._read_offset, len(self.ids) - WINDOW)
        self._read_offset = len(self.ids)
        return piece

    def finish(self) -> str:
        """The rest of the text (held-back bytes at the end); afterwards `text` equals the full decode."""
        full = self._decode(self.ids)
        if full.startswith(self.text):
            piece = full[len(self.text) :]
            self.text = full
            return piece
        return ""  # cannot happen for the tokenizers we know; the emitted text stands

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
