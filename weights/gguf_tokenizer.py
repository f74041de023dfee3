"""Rebuilding a Hugging Face tokenizer.json from a GGUF file's vocabulary.

A GGUF stores no tokenizer.json, only the pieces llama.cpp needs: the token strings (already
spelled in GPT-2's byte-to-unicode alphabet, "Ġ" for a space), the BPE merges, a type per token
(3 = control, 4 = user-defined) and the *name* of the pre-tokenizer regex the vocabulary was
trained with (`tokenizer.ggml.pre`). The names are llama.cpp's; each maps to a known Hugging
Face pre-tokenizer, and using the wrong one silently changes how text is split (for SmolLM2,
digits must be split one by one), so unknown names are refused rather than guessed.

SentencePiece vocabularies (`tokenizer.ggml.model == "llama"`, e.g. Llama 2) are not rebuilt:
their normalizer/decoder details vary by model and a wrong guess would be silent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from .errors import fail

CONTROL, USER_DEFINED = 3, 4

# Llama 3's split regex, as in its tokenizer.json (llama.cpp calls it "llama-bpe").
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def pre_tokenizer_for(pre: str, path: Path) -> pre_tokenizers.PreTokenizer:
    """The HF pre-tokenizer that llama.cpp's pre-tokenizer name `pre` stands for."""
    if pre == "smollm":
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in ("llama-bpe", "llama3", "llama-v3"):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre in ("gpt-2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raise fail(
        path,
        f"GGUF pre-tokenizer {pre!r} is not supported "
        "(supported: smollm, llama-bpe, gpt-2, default)",
    )


def build_tokenizer(meta: dict[str, Any], path: Path) -> tuple[Tokenizer, dict[str, Any]]:
    """(tokenizer.json's Tokenizer, tokenizer_config.json dict) from GGUF metadata."""
    model = meta.get("tokenizer.ggml.model")
    if "tokenizer.huggingface.json" in meta:  # some converters embed the original file
        tokenizer = Tokenizer.from_str(meta["tokenizer.huggingface.json"])
        tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
    elif model == "gpt2":
        tokens = list(meta["tokenizer.ggml.tokens"])
        tokenizer = _byte_level_bpe(meta, tokens, path)
    elif model == "llama":
        raise fail(
            path,
            "SentencePiece GGUF vocabularies (tokenizer.ggml.model = llama) are not "
            "supported; use the model's Hugging Face folder instead",
        )
    else:
        raise fail(path, f"GGUF tokenizer model {model!r} is not supported (need gpt2 BPE)")

    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    config: dict[str, Any] = {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get("llama.context_length", 2048)),
        # The generic class: transformers then uses tokenizer.json exactly as written.
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if isinstance(meta.get("tokenizer.chat_template"), str):
        config["chat_template"] = meta["tokenizer.chat_template"]
    config["added_tokens_decoder"] = {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(tokenizer.get_added_tokens_decoder().items())
    }
    return tokenizer, config


def _byte_level_bpe(meta: dict[str, Any], tokens: list[str], path: Path) -> Tokenizer:
    merges_text = meta.get("tokenizer.ggml.merges")
    if not merges_text:
        raise fail(path, "GGUF BPE vocabulary has no merges (tokenizer.ggml.merges)")
    merges = []
    for merge in merges_text:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise fail(path, f"bad BPE merge {merge!r} in tokenizer.ggml.merges")
        merges.append((left, right))
    vocab = {t: i for i, t in enumerate(tokens)}
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=False
        )
    )
    tokenizer.pre_tokenizer = pre_tokenizer_for(meta.get("tokenizer.ggml.pre", "default"), path)
    tokenizer.decoder = decoders.ByteLevel()

    types = list(meta.get("tokenizer.ggml.token_type") or [])
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == CONTROL
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == USER_DEFINED
    ]
    # Both already have ids in the vocabulary; adding them makes the tokenizer match them whole
    # in text (instead of cutting "<|im_start|>" into pieces) and, for control, skip on decode.
    tokenizer.add_special_tokens(control)
    tokenizer.add_tokens(user)

    byte_level = processors.ByteLevel(trim_offsets=False)
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token") and bos_id is not None:
        bos = tokens[bos_id]
        tokenizer.post_processor = processors.Sequence(
            [
                byte_level,
                processors.TemplateProcessing(
                    single=f"{bos}:0 $A:0",
                    pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                    special_tokens=[(bos, bos_id)],
                ),
            ]
        )
    else:
        tokenizer.post_processor = byte_level
    return tokenizer
