"""Streaming detokenization: turn one new token id at a time into the text it adds.

Decoding token by token and concatenating is wrong in two ways:

* byte-level BPE splits multi-byte UTF-8 characters across tokens (an emoji is often 2-4
  tokens), so a single token may decode to half a character, which `decode` shows as U+FFFD;
* some decoders depend on neighbours (sentencepiece's "▁" becomes a space except at the start
  of the text), so decode([a]) + decode([b]) != decode([a, b]).

The fix used by TGI and vLLM keeps two offsets into the ids: `prefix` marks the start of a small
window of already-emitted tokens kept as context, `read` the end of what has been emitted. Each
step decodes window+new and window alone; the new text is the difference. While the result ends
in U+FFFD (an unfinished character) nothing is emitted and the offsets stay put, so the next
token completes the character. Each step decodes a handful of tokens, not the whole sequence.
"""

from __future__ import annotations

from .tokenizer import Tokenizer

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Feed ids with `add`; it returns only new, complete text. `text` is all text emitted."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._decode = tokenizer.backend.decode
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # start of the context window
        self._read = 0  # end of the tokens whose text has been emitted
        self._pieces: list[str] = []

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._pieces)

    def add(self, token_id: int) -> str:
        """Append one id; return the text it completes ("" while a character is unfinished)."""
        self.ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """At the end of a sequence: emit whatever is held back (e.g. a trailing U+FFFD)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        window = self.ids[self._prefix :]
        before = self._decode(self.ids[self._prefix : self._read], self.skip_special_tokens)
        after = self._decode(window, self.skip_special_tokens)
        if len(after) <= len(before) or (after.endswith(REPLACEMENT) and not final):
            return ""  # nothing visible yet (a special token skipped, or half a character)
        new = after[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        self._pieces.append(new)
        return new
