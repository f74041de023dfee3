"""What every benchmark builds the same way: its EngineConfig, and --config's model folder.

`tinychat bench`'s workloads, `bench serve` and `bench app` take the same engine arguments
(add_engine_arguments in gpu/bench/__init__.py), so one function turns them into the config.
A served or app-driven engine loads its model by path and streams text, so --config's random
weights are written to a folder with a word-per-id tokenizer: random weights pick ids all over
the vocabulary, and a byte-level tokenizer would decode nearly all of them to nothing.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from gpu.config import EngineConfig

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig of a bench's command line (sizes, eager, async scheduling, precision)."""
    config = EngineConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        precision=getattr(args, "precision", None),
        batch_invariant=getattr(args, "batch_invariant", False),
    )
    if getattr(args, "async_scheduling", None) is not None:
        config.async_scheduling = args.async_scheduling
    return config


def word_tokenizer(vocab_size: int, paragraph: int | None = None) -> Any:
    """A tokenizer whose every id decodes to a word of its own (three letters and digits and a
    number, joined by spaces); with `paragraph`, one id in that many opens a new paragraph (the
    app's Markdown then has blocks to lay out, as a real reply does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    n = len(ALPHABET)
    vocab = {}
    for i in range(vocab_size):
        a, rest = divmod(i, n * n)
        b, c = divmod(rest, n)
        word = f"{ALPHABET[a % n]}{ALPHABET[b]}{ALPHABET[c]}{a // n}"
        opens = paragraph is not None and i % paragraph == paragraph - 1
        vocab["\n\n" + word if opens else word] = i
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="aaa0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # words, spaces between
    return tokenizer


def save_word_tokenizer(folder: Path, vocab_size: int, paragraph: int | None = None) -> None:
    """The word tokenizer in `folder`, with no special tokens (the requests ignore EOS, and
    chat templates fall back to the built-in ChatML one)."""
    folder.mkdir(parents=True, exist_ok=True)
    word_tokenizer(vocab_size, paragraph).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": None}))


def random_model_folder(
    folder: Path, config_name: str, layers: int | None = None, paragraph: int | None = None
) -> Path:
    """The preset's random bf16 weights (seed 0) and a word tokenizer, written into `folder`."""
    from gpu.presets import preset_config
    from weights.random_model import write_random_model

    overrides = {"num_hidden_layers": layers} if layers else {}
    config = preset_config(config_name, **overrides)
    write_random_model(folder, config, seed=0)
    save_word_tokenizer(folder, config.vocab_size, paragraph)
    return folder


def cached_random_model_folder(
    config_name: str, layers: int | None = None, paragraph: int | None = None
) -> Path:
    """random_model_folder in the system's temporary folder, written once and reused by every
    later bench on this machine (Llama-3.2-1B's 2.5 GB take ~16 s to draw and write; the
    same weights in every run also keep the logits, and so top-p's work, the same). Used by
    bench startup, bench serve and bench app (with its paragraph tokenizer)."""
    name = f"tinychat-bench-{config_name}" + (f"-{layers}-layers" if layers else "")
    folder = Path(tempfile.gettempdir()) / (name + (f"-p{paragraph}" if paragraph else ""))
    done = folder / ".complete"
    if not done.exists():
        print(f"writing {config_name}'s random weights to {folder} (once)...", flush=True)
        random_model_folder(folder, config_name, layers, paragraph)
        done.touch()
    return folder
