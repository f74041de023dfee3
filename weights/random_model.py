"""Random-weight model folders, for tests that need a model but not a trained one.

Engine tests compare our forward pass against transformers on configs shaped like real models
(e.g. Llama-3.2-1B with 2 layers), and loader tests need folders to break on purpose. This writes
a complete HF folder (config.json, generation_config.json, model.safetensors or shards with an
index, tokenizer.json, tokenizer_config.json) that both tinychat and transformers load.

The default tokenizer is the smallest real one: byte-level BPE with the 256 byte tokens, no
merges, and ChatML's special tokens, so every text encodes (one token per byte) and the ChatML
template works. Pass `tokenizer_from` to copy a real tokenizer instead.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from .bf16 import float32_to_bf16_bits
from .checkpoint import INDEX_FILE, SINGLE_FILE, llama_tensor_shapes
from .config import ModelConfig
from .generation_config import GenerationConfig
from .safetensors_format import NUMPY_DTYPES, SafetensorsWriter

CHATML_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_level_tokenizer(specials: tuple[str, ...] = CHATML_SPECIALS) -> Tokenizer:
    """Byte-level BPE over the 256 bytes (ids 0-255), specials at 256, 257, ..."""
    byte_to_char = pre_tokenizers.ByteLevel.alphabet()
    # Order the alphabet by the byte each character stands for, so id == byte value.
    ordered = sorted(byte_to_char, key=_byte_of)
    vocab = {ch: i for i, ch in enumerate(ordered)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def _byte_of(ch: str) -> int:
    # GPT-2's byte-to-unicode map: printable bytes are themselves, the rest start at U+0100.
    code = ord(ch)
    if 33 <= code <= 126 or 161 <= code <= 172 or 174 <= code <= 255:
        return code
    others = [b for b in range(256) if not (33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255)]
    return others[code - 256]


def write_random_model(
    folder: Path | str,
    config: ModelConfig,
    seed: int = 0,
    dtype: str = "BF16",
    shards: int = 1,
    tokenizer_from: Path | str | None = None,
) -> Path:
    """Write a loadable model folder with random weights (N(0, 0.02); norms near 1)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    (folder / "config.json").write_text(
        json.dumps(
            {
                **config.to_dict(),
                "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype],
            },
            indent=2,
        )
    )
    gen = GenerationConfig(eos_token_ids=config.eos_token_ids, bos_token_id=config.bos_token_id)
    (folder / "generation_config.json").write_text(json.dumps(gen.to_dict(), indent=2))
    _write_tokenizer(folder, tokenizer_from)

    shapes = list(llama_tensor_shapes(config).items())
    per_shard = math.ceil(len(shapes) / shards)
    groups = [shapes[i : i + per_shard] for i in range(0, len(shapes), per_shard)]
    weight_map: dict[str, str] = {}
    for n, group in enumerate(groups, start=1):
        filename = SINGLE_FILE if shards == 1 else f"model-{n:05d}-of-{len(groups):05d}.safetensors"
        with SafetensorsWriter(folder / filename, [(k, dtype, s) for k, s in group]) as writer:
            for name, shape in group:
                if len(shape) == 1:  # a norm weight
                    values = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
                else:
                    values = 0.02 * rng.standard_normal(shape, dtype=np.float32)
                writer.write(name, _encode(values, dtype))
                weight_map[name] = filename
    if shards > 1:
        index = {"metadata": {}, "weight_map": weight_map}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return folder


def _encode(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return float32_to_bf16_bits(values)
    return values.astype(NUMPY_DTYPES[dtype])


def _write_tokenizer(folder: Path, tokenizer_from: Path | str | None) -> None:
    if tokenizer_from is not None:
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (Path(tokenizer_from) / name).is_file():
                shutil.copy(Path(tokenizer_from) / name, folder / name)
        return
    byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    tokenizer_config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
