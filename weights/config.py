"""config.json -> `ModelConfig`: the shape of a Llama model, typed and checked.

Hugging Face configs grew by accretion: `eos_token_id` may be an int or a list, `head_dim` may be
missing or null, rope scaling is `rope_scaling` (`type` or `rope_type`) in transformers 4 and
`rope_parameters` (which also holds `rope_theta`) in transformers 5, the dtype is `torch_dtype` or
`dtype`. This module reads all of those spellings, rejects what the engine cannot run (another
architecture, biases, sliding windows, quantized checkpoints, exotic rope scaling) with one clear
line, and writes back the classic transformers-4 spelling, which every transformers version reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ModelLoadError, fail

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")
# Mistral checkpoints without a sliding window are Llama checkpoints under another name: same
# tensors, same math. With a window they are not (attention would have to be windowed).
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are stretched for long contexts (`llama3`: Llama 3.1+'s scheme)."""

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(
                f"rope scaling type {self.rope_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
            )

    def to_dict(self) -> dict[str, Any]:
        """The `rope_scaling` entry of an HF config.json."""
        if self.rope_type == "llama3":
            return {
                "rope_type": "llama3",
                "factor": self.factor,
                "low_freq_factor": self.low_freq_factor,
                "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_position_embeddings,
            }
        return {"rope_type": self.rope_type, "factor": self.factor}


@dataclass(frozen=True)
class ModelConfig:
    """The hyper-parameters of a Llama-architecture model, as the engine needs them."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    torch_dtype: str

    @classmethod
    def from_json(cls, path: Path | str) -> ModelConfig:
        """Read and check a config.json; every problem is a `ModelLoadError` naming the file."""
        path = Path(path)
        if not path.is_file():
            raise fail(path, "no config.json here (is this a Hugging Face model folder?)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise fail(path, f"not valid JSON ({exc})") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config.json") -> ModelConfig:
        """Build from a parsed config.json dict; `source` names the file in error messages."""
        if not isinstance(d, dict):
            raise fail(source, "expected a JSON object")
        reader = _Reader(d, source)
        model_type = _check_architecture(d, source)
        for key in ("attention_bias", "mlp_bias"):
            if d.get(key):
                raise fail(source, f"{key}=true is not supported (Llama has no biases)")
        if d.get("quantization_config"):
            method = d["quantization_config"].get("quant_method", "?")
            raise fail(source, f"quantized checkpoints ({method}) are not supported; use bf16")
        act = d.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise fail(source, f"hidden_act {act!r} is not supported (Llama uses silu)")
        window = d.get("sliding_window")
        if window is not None and d.get("use_sliding_window", True):
            max_pos = d.get("max_position_embeddings", 0)
            if window < max_pos:
                raise fail(source, f"sliding_window={window} attention is not supported")

        hidden = reader.integer("hidden_size")
        heads = reader.integer("num_attention_heads")
        kv_heads = reader.integer("num_key_value_heads", default=heads)
        if heads % kv_heads:
            raise fail(source, f"num_attention_heads={heads} is not a multiple of {kv_heads=}")
        head_dim = reader.integer("head_dim", default=None)
        if head_dim is None:
            if hidden % heads:
                raise fail(source, f"hidden_size={hidden} not divisible by {heads} heads")
            head_dim = hidden // heads
        if head_dim % 2:
            raise fail(source, f"head_dim={head_dim} must be even for rotary embeddings")

        rope_theta, rope_scaling = _read_rope(d, source)
        dtype = d.get("torch_dtype", d.get("dtype")) or "bfloat16"
        if dtype not in SUPPORTED_DTYPES:
            raise fail(
                source, f"unknown dtype {dtype!r} (supported: {', '.join(SUPPORTED_DTYPES)})"
            )
        return cls(
            model_type=model_type,
            vocab_size=reader.integer("vocab_size"),
            hidden_size=hidden,
            intermediate_size=reader.integer("intermediate_size"),
            num_hidden_layers=reader.integer("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=reader.number("rms_norm_eps", default=1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=reader.integer("max_position_embeddings", default=2048),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=reader.integer("bos_token_id", default=None, minimum=0),
            eos_token_ids=token_ids(d.get("eos_token_id"), source, "eos_token_id"),
            torch_dtype=dtype,
        )

    def to_dict(self) -> dict[str, Any]:
        """An HF config.json (transformers-4 key names, which transformers 5 also reads)."""
        eos: int | list[int] | None = list(self.eos_token_ids) or None
        if eos is not None and len(eos) == 1:
            eos = eos[0]
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.to_dict() if self.rope_scaling else None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "torch_dtype": self.torch_dtype,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "initializer_range": 0.02,
            "pretraining_tp": 1,
            "use_cache": True,
        }


def token_ids(value: Any, source: str, key: str) -> tuple[int, ...]:
    """An `eos_token_id`-style entry (absent, an int or a list of ints) as a tuple."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items):
        raise fail(source, f"{key} must be a token id or a list of them, got {value!r}")
    return tuple(dict.fromkeys(items))  # unique, order kept


class _Reader:
    """Typed access to config keys, with the file named in every complaint."""

    def __init__(self, d: dict[str, Any], source: str) -> None:
        self.d, self.source = d, source

    _REQUIRED = object()

    def integer(self, key: str, default: Any = _REQUIRED, minimum: int = 1) -> Any:
        value = self.d.get(key)
        if value is None:
            if default is _Reader._REQUIRED:
                raise fail(self.source, f"missing {key!r}")
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise fail(self.source, f"{key} must be an integer >= {minimum}, got {value!r}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.d.get(key, default)
        if value is None:
            value = default
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise fail(self.source, f"{key} must be a positive number, got {value!r}")
        return float(value)


def _check_architecture(d: dict[str, Any], source: str) -> str:
    model_type = d.get("model_type")
    architectures = d.get("architectures") or []
    if model_type is None and architectures:
        # Some hand-written configs only name the class.
        by_class = {cls: mt for mt, cls in _ARCHITECTURES.items()}
        model_type = next((by_class[a] for a in architectures if a in by_class), None)
    if model_type not in _ARCHITECTURES:
        named = model_type or (architectures[0] if architectures else "nothing")
        raise fail(source, f"model_type {named!r} is not a Llama-architecture model")
    unknown = [a for a in architectures if a != _ARCHITECTURES[model_type]]
    if unknown:
        raise fail(source, f"architecture {unknown[0]!r} is not supported (need LlamaForCausalLM)")
    return model_type


def _read_rope(d: dict[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    """(rope_theta, rope scaling or None) from either transformers 4 or 5 spelling."""
    params = d.get("rope_parameters")
    if isinstance(params, dict) and "rope_scaling" not in d:
        scaling: Any = params
        theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    else:
        scaling = d.get("rope_scaling")
        theta = d.get("rope_theta", 10000.0)
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise fail(source, f"rope_theta must be a positive number, got {theta!r}")
    if scaling is None:
        return float(theta), None
    if not isinstance(scaling, dict):
        raise fail(source, f"rope_scaling must be an object, got {scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise fail(
            source,
            f"rope_scaling type {rope_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})",
        )
    if rope_type == "default":
        return float(theta), None  # one spelling of "no scaling" for the engine
    defaults = RopeScaling("llama3")
    try:
        rope = RopeScaling(
            rope_type=rope_type,
            factor=float(scaling.get("factor", 1.0)),
            low_freq_factor=float(scaling.get("low_freq_factor", defaults.low_freq_factor)),
            high_freq_factor=float(scaling.get("high_freq_factor", defaults.high_freq_factor)),
            original_max_position_embeddings=int(
                scaling.get(
                    "original_max_position_embeddings", defaults.original_max_position_embeddings
                )
            ),
        )
    except (TypeError, ValueError) as exc:
        raise fail(source, f"bad rope_scaling {scaling!r} ({exc})") from None
    if rope.factor <= 0 or rope.high_freq_factor <= rope.low_freq_factor:
        raise fail(source, f"bad rope_scaling values {scaling!r}")
    return float(theta), rope
