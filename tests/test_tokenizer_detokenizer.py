"""Streaming detokenization: the pieces must add up to the full decode, and never show half a
character. Checked on random token sequences (hypothesis) for a byte-level BPE tokenizer (GPT-2,
Llama 3, SmolLM2 style) and a sentencepiece-style one (byte fallback, "▁" spaces, Llama 2 style),
and on the real SmolLM2 / Llama 3.2 tokenizers."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers

from weights import IncrementalDetokenizer, Tokenizer
from weights.random_model import byte_level_tokenizer

REPLACEMENT = "\ufffd"
BYTE_LEVEL = Tokenizer(byte_level_tokenizer(), eos_token="<|im_end|>")  # ids 0-255 = bytes


def sentencepiece_style() -> Tokenizer:
    """Llama-2-like: "▁" for spaces, byte-fallback tokens <0x..> for anything not in the vocab."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "a", "b", "c", "▁a", "ab", "▁ab", "é", "▁b"]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [("▁", "a"), ("a", "b"), ("▁a", "b"), ("▁", "b")]
    tok = HFTokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(["<s>", "</s>"])
    return Tokenizer(tok, bos_token="<s>", eos_token="</s>")


SENTENCEPIECE = sentencepiece_style()


def stream(tok: Tokenizer, ids: list[int], skip: bool = True) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    pieces = [detok.add(i) for i in ids]
    tail = detok.flush()
    assert detok.text == "".join(pieces) + tail
    return pieces, tail


# Text with spaces, ASCII, 2/3/4-byte characters and a ZWJ emoji sequence, so characters are
# split across byte tokens in every possible way.
TEXT = st.text(alphabet=st.sampled_from(list("ab c\n\té€日😀👨‍👩‍👧ẞ")), max_size=40)


@given(TEXT)
def test_byte_level_valid_text(text: str) -> None:
    ids = BYTE_LEVEL.encode(text)
    pieces, tail = stream(BYTE_LEVEL, ids)
    assert "".join(pieces) == BYTE_LEVEL.decode(ids) == text
    assert tail == ""
    assert not any(REPLACEMENT in p for p in pieces)  # never half a character


@given(st.lists(st.integers(0, 258), max_size=60), st.booleans())
def test_byte_level_random_ids(ids: list[int], skip: bool) -> None:
    # Arbitrary bytes (invalid UTF-8 too) and special tokens: stream + flush == full decode.
    pieces, tail = stream(BYTE_LEVEL, ids, skip)
    assert "".join(pieces) + tail == BYTE_LEVEL.decode(ids, skip_special_tokens=skip)


@given(TEXT)
def test_sentencepiece_style_valid_text(text: str) -> None:
    ids = SENTENCEPIECE.encode(text)
    pieces, tail = stream(SENTENCEPIECE, ids)
    assert "".join(pieces) + tail == SENTENCEPIECE.decode(ids)
    assert tail == "" and not any(REPLACEMENT in p for p in pieces)


@given(st.lists(st.sampled_from([1, 2, *range(259, 268)]), max_size=40), st.booleans())
def test_sentencepiece_style_random_pieces(ids: list[int], skip: bool) -> None:
    # Whole pieces (no byte tokens): the leading-space rule of "▁" must come out right.
    pieces, tail = stream(SENTENCEPIECE, ids, skip)
    assert "".join(pieces) + tail == SENTENCEPIECE.decode(ids, skip_special_tokens=skip)


def test_split_emoji_waits_for_its_last_byte() -> None:
    ids = list("😀".encode())  # 4 byte tokens
    detok = IncrementalDetokenizer(BYTE_LEVEL)
    assert [detok.add(i) for i in ids] == ["", "", "", "😀"]


def test_special_tokens_skipped_or_kept() -> None:
    ids = [*b"hi", 258, *b"!"]
    assert "".join(stream(BYTE_LEVEL, ids)[0]) == "hi!"
    assert "".join(stream(BYTE_LEVEL, ids, skip=False)[0]) == "hi<|im_end|>!"


def test_each_step_decodes_a_small_window() -> None:
    calls: list[int] = []
    backend = BYTE_LEVEL.backend

    class Counting:
        def decode(self, ids, skip_special_tokens=True):
            calls.append(len(ids))
            return backend.decode(ids, skip_special_tokens=skip_special_tokens)

    tok = Tokenizer(byte_level_tokenizer())
    tok.backend = Counting()  # type: ignore[assignment]
    detok = IncrementalDetokenizer(tok)
    text = "A long reply, 日本語 and emoji 😀, repeated. " * 40
    for i in text.encode():
        detok.add(i)
    assert detok.text == text
    assert max(calls) <= 8  # a handful of tokens per step, not the whole sequence


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_real_tokenizers_random_ids(data, default_model_dir: Path, llama32_tokenizer_dir) -> None:
    for folder in (default_model_dir, llama32_tokenizer_dir):
        tok = real_tokenizer(folder)
        ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=40))
        pieces, tail = stream(tok, ids)
        assert "".join(pieces) + tail == tok.decode(ids)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["default_model_dir", "llama32_tokenizer_dir"])
def test_real_tokenizers_tricky_text(request, which: str) -> None:
    tok = real_tokenizer(request.getfixturevalue(which))
    text = "Hi  there!\r\n\t 日本語 👨‍👩‍👧‍👦 🇫🇷 e\u0301 1234567 ```py\nx = 1\n```  "
    ids = tok.encode(text)
    pieces, tail = stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids) == text and tail == ""
    assert not any(REPLACEMENT in p for p in pieces)


_CACHE: dict[Path, Tokenizer] = {}


def real_tokenizer(folder: Path) -> Tokenizer:
    if folder not in _CACHE:
        _CACHE[folder] = Tokenizer.from_folder(folder)
    return _CACHE[folder]


def _pieces(tok: Tokenizer, ids: list[int], skip: bool, rust: bool) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    if not rust:
        detok._stream = None  # the Python steps, as where tokenizers has no DecodeStream
    return [detok.add(i) for i in ids] + [detok.flush()]


@given(st.lists(st.integers(0, 258), max_size=60), st.booleans())
def test_rust_stream_and_python_steps_give_the_same_pieces(ids: list[int], skip: bool) -> None:
    for tok, top in ((BYTE_LEVEL, 258), (SENTENCEPIECE, 267)):
        ids = [min(i, top) for i in ids]
        assert _pieces(tok, ids, skip, rust=True) == _pieces(tok, ids, skip, rust=False)
