"""A model folder's weights: one model.safetensors, or shards listed by an index.

Sharded checkpoints (Llama 3.2 3B and up) come as `model-00001-of-00002.safetensors`, ... plus
`model.safetensors.index.json`, whose `weight_map` says which shard holds each tensor. We check
the whole map before touching any data (every shard present, every tensor where the index says),
because a half-downloaded folder is the most common broken model and should fail at once.

`llama_tensor_shapes` is the contract between a config and its weights: the HF Llama names and
the shape each must have. `check_llama_tensors` compares a checkpoint's headers against it, which
is cheap (no data is read) and turns a wrong file into a clear error instead of a reshape crash
deep inside the engine.
"""

from __future__ import annotations

import json
from pathlib import Path

from .config import ModelConfig
from .errors import fail
from .safetensors_format import Tensor, TensorInfo, map_tensors, read_header

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def checkpoint_index(folder: Path | str) -> dict[str, TensorInfo]:
    """Name -> location of every tensor in the folder's checkpoint (headers only, no data)."""
    folder = Path(folder)
    index_path = folder / INDEX_FILE
    if index_path.is_file():
        return _sharded_index(index_path)
    single = folder / SINGLE_FILE
    if single.is_file():
        return read_header(single)
    if not folder.is_dir():
        raise fail(folder, "no such model folder")
    others = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
    hint = f" (found {others[0]}: PyTorch pickles are not supported)" if others else ""
    raise fail(folder, f"no {SINGLE_FILE} or {INDEX_FILE}{hint}")


def load_checkpoint(folder: Path | str) -> dict[str, Tensor]:
    """Every tensor of the folder's checkpoint, memory-mapped (nothing is copied)."""
    return map_tensors(checkpoint_index(folder).values())


def _sharded_index(index_path: Path) -> dict[str, TensorInfo]:
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise fail(index_path, "not a valid safetensors index (no weight_map object)") from None
    folder = index_path.parent
    headers: dict[str, dict[str, TensorInfo]] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = folder / shard
        if not shard_path.is_file():
            raise fail(shard_path, f"shard listed in {INDEX_FILE} is missing")
        headers[shard] = read_header(shard_path)
    infos: dict[str, TensorInfo] = {}
    for name, shard in weight_map.items():
        info = headers[shard].get(name)
        if info is None:
            raise fail(folder / shard, f"tensor {name!r} listed in {INDEX_FILE} is not in it")
        infos[name] = info
    return infos


def llama_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The HF Llama tensor names a config implies, with their shapes (out, in)."""
    h, q = config.hidden_size, config.num_attention_heads * config.head_dim
    kv, ff = config.num_key_value_heads * config.head_dim, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (ff, h),
                p + "mlp.up_proj.weight": (ff, h),
                p + "mlp.down_proj.weight": (h, ff),
            }
        )
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def check_llama_tensors(folder: Path, index: dict[str, TensorInfo], config: ModelConfig) -> None:
    """Raise a `ModelLoadError` unless every tensor the config needs is there with its shape."""
    for name, shape in llama_tensor_shapes(config).items():
        info = index.get(name)
        if info is None:
            hint = ""
            if name == "lm_head.weight":
                hint = " (or set tie_word_embeddings in config.json)"
            raise fail(folder, f"checkpoint has no tensor {name!r}{hint}")
        if info.shape != shape:
            raise fail(
                info.path,
                f"tensor {name!r} has shape {list(info.shape)}, config.json implies {list(shape)}",
            )
