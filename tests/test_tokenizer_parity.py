"""Tokenizer and chat-template parity with transformers, on the real tokenizers.

tests/golden/tokenizer_golden.json was written by tests/golden/make_tokenizer_golden.py with
transformers' AutoTokenizer; here weights.Tokenizer must reproduce every id, every decoded string
and every rendered prompt. Two tokenizers: the converted default model's (SmolLM2, rebuilt from
the GGUF with the smollm pre-tokenizer, its own ChatML template) and Llama 3.2's (128,256 tokens
plus the Vision models' <|image|>, no template of its own: tinychat's built-in llama3 template,
rendered against transformers' rendering of Llama 3.2 Instruct's template).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weights import Tokenizer
from weights.tokenizer import builtin_template

pytestmark = pytest.mark.slow

GOLDEN = json.loads(
    (Path(__file__).parent / "golden" / "tokenizer_golden.json").read_text(encoding="utf-8")
)


@pytest.fixture(scope="module")
def smollm2(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_folder(default_model_dir)


@pytest.fixture(scope="module")
def llama32(llama32_tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_folder(llama32_tokenizer_dir)


def tokenizer_for(request: pytest.FixtureRequest, which: str) -> Tokenizer:
    return request.getfixturevalue(which)


@pytest.mark.parametrize("which", ["smollm2", "llama32"])
def test_vocabulary(request, which: str) -> None:
    tok, golden = tokenizer_for(request, which), GOLDEN[which]
    assert tok.vocab_size == golden["vocab_size"]
    # transformers 5 counts only the *named* special tokens (bos, eos, unk, pad, ...); ours are
    # every id that decode(skip_special_tokens=True) drops, which includes those.
    assert set(golden["all_special_ids"]) <= tok.all_special_ids
    assert all(tok.decode([i]) == "" for i in tok.all_special_ids)
    assert tok.decode(sorted(tok.all_special_ids), skip_special_tokens=False) != ""


def text_cases(which: str) -> list:
    return [pytest.param(which, i, id=f"{which}-{i}") for i in range(len(GOLDEN[which]["texts"]))]


@pytest.mark.parametrize("which, i", text_cases("smollm2") + text_cases("llama32"))
def test_encode_decode(request, which: str, i: int) -> None:
    tok, case = tokenizer_for(request, which), GOLDEN[which]["texts"][i]
    assert tok.encode(case["text"]) == case["ids"]
    assert tok.encode(case["text"], add_special_tokens=True) == case["ids_with_special_tokens"]
    assert tok.decode(case["ids"]) == case["decoded"]
    assert tok.decode(case["ids"], skip_special_tokens=False) == case["decoded_with_specials"]


def test_enough_tricky_strings() -> None:
    for which in ("smollm2", "llama32"):
        assert len(GOLDEN[which]["texts"]) >= 30


def chat_cases(which: str) -> list:
    return [pytest.param(which, i, id=f"{which}-{i}") for i in range(len(GOLDEN[which]["chats"]))]


@pytest.mark.parametrize("which, i", chat_cases("smollm2") + chat_cases("llama32"))
def test_chat_template(request, which: str, i: int) -> None:
    tok, case = tokenizer_for(request, which), GOLDEN[which]["chats"][i]
    extra = dict(case.get("kwargs") or {})
    if case.get("tools") is not None:
        extra["tools"] = case["tools"]
    gen = case["add_generation_prompt"]
    text = tok.apply_chat_template(
        case["messages"], add_generation_prompt=gen, tokenize=False, **extra
    )
    assert text == case["text"]
    assert (
        tok.apply_chat_template(case["messages"], add_generation_prompt=gen, **extra) == case["ids"]
    )


def test_llama32_uses_the_builtin_llama3_template(llama32: Tokenizer) -> None:
    assert llama32.chat_template == builtin_template("llama3")
    assert llama32.vocab_size == 128257  # 128,256 + the Vision models' <|image|>
    assert llama32.token_to_id("<|eot_id|>") == 128009
    assert llama32.bos_token_id == 128000 and llama32.eos_token_id == 128001


def test_smollm2_template_has_its_default_system_prompt(smollm2: Tokenizer) -> None:
    case = GOLDEN["smollm2"]["chats"][0]
    assert "You are a helpful AI assistant named SmolLM, trained by Hugging Face" in case["text"]
