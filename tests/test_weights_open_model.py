"""open_model: a whole folder read and cross-checked, and each way a folder can be broken."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from weights import (
    ModelConfig,
    ModelLoadError,
    RopeScaling,
    llama_tensor_shapes,
    open_model,
    write_random_model,
)
from weights.checkpoint import checkpoint_index

TINY = ModelConfig(
    model_type="llama",
    vocab_size=300,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 64),
    max_position_embeddings=256,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_ids=(258,),
    torch_dtype="bfloat16",
)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_random_model(tmp_path / "tiny", TINY, seed=3)


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_open_random_model(tiny: Path) -> None:
    m = open_model(tiny)
    assert m.config == TINY
    assert m.folder == tiny.absolute() and m.name == "tiny"
    assert m.tokenizer.vocab_size == 259 and m.tokenizer.eos_token == "<|im_end|>"
    assert m.generation_config.eos_token_ids == (258,)
    assert m.eos_token_ids == (258,)
    tensors = m.tensors()
    assert set(tensors) == set(llama_tensor_shapes(TINY))
    assert tensors["lm_head.weight"].shape == (300, 32)
    assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (16, 32)
    assert m.tensors() is tensors  # mapped once
    assert tensors["model.norm.weight"].dtype == "BF16"
    assert abs(float(tensors["model.norm.weight"].float32().mean()) - 1.0) < 0.2


@pytest.mark.parametrize("dtype", ["F16", "F32"])
def test_other_dtypes_and_shards(tmp_path: Path, dtype: str) -> None:
    folder = write_random_model(tmp_path / "m", TINY, dtype=dtype, shards=3)
    assert (folder / "model.safetensors.index.json").is_file()
    m = open_model(folder)
    assert {t.dtype for t in m.tensors().values()} == {dtype}
    one = write_random_model(tmp_path / "one", TINY, dtype=dtype)
    a, b = open_model(one).tensors(), m.tensors()
    for name in a:  # same seed, same values, however the files are cut
        np.testing.assert_array_equal(a[name].data, b[name].data)


def test_tied_embeddings_need_no_lm_head(tmp_path: Path) -> None:
    from dataclasses import replace

    folder = write_random_model(tmp_path / "tied", replace(TINY, tie_word_embeddings=True))
    m = open_model(folder)
    assert "lm_head.weight" not in m.tensors() and m.config.tie_word_embeddings


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such model folder"):
        open_model(tmp_path / "nowhere")


def test_missing_config(tiny: Path) -> None:
    (tiny / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="no config.json"):
        open_model(tiny)


def test_not_llama(tiny: Path) -> None:
    edit_json(tiny / "config.json", model_type="gemma", architectures=["GemmaForCausalLM"])
    with pytest.raises(ModelLoadError, match="config.json: model_type 'gemma' is not a Llama"):
        open_model(tiny)


def test_untied_without_lm_head(tiny: Path) -> None:
    from weights import Tensor, load_checkpoint, save_tensors

    tensors = {k: v for k, v in load_checkpoint(tiny).items() if k != "lm_head.weight"}
    copies = [Tensor(t.name, t.dtype, t.shape, np.array(t.data)) for t in tensors.values()]
    save_tensors(tiny / "model.safetensors", copies)
    with pytest.raises(ModelLoadError, match="no tensor 'lm_head.weight'.*tie_word_embeddings"):
        open_model(tiny)


def test_wrong_shape(tiny: Path) -> None:
    edit_json(tiny / "config.json", intermediate_size=64)
    with pytest.raises(ModelLoadError, match=r"'model.layers.0.mlp.gate_proj.weight' has shape "):
        open_model(tiny)


def test_tokenizer_larger_than_embedding(tiny: Path) -> None:
    edit_json(tiny / "config.json", vocab_size=200)
    with pytest.raises(ModelLoadError, match="tokenizer has 259 tokens but .* vocab_size is 200"):
        open_model(tiny)


def test_embedding_padded_larger_than_tokenizer_is_fine(tiny: Path) -> None:
    assert open_model(tiny).tokenizer.vocab_size < TINY.vocab_size  # 259 < 300


def test_eos_outside_vocab(tiny: Path) -> None:
    edit_json(tiny / "config.json", eos_token_id=[258, 5000])
    with pytest.raises(ModelLoadError, match="token id 5000 is outside"):
        open_model(tiny)


def test_missing_and_broken_tokenizer(tiny: Path) -> None:
    text = (tiny / "tokenizer.json").read_text()
    (tiny / "tokenizer.json").write_text(text[: len(text) // 2])
    with pytest.raises(ModelLoadError, match="tokenizer.json: not a valid tokenizer file"):
        open_model(tiny)
    (tiny / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        open_model(tiny)


def test_eos_token_not_in_vocab(tiny: Path) -> None:
    edit_json(tiny / "tokenizer_config.json", eos_token="<|eot_id|>")
    with pytest.raises(ModelLoadError, match="eos_token '<|eot_id|>' is not in the vocabulary"):
        open_model(tiny)


def test_attention_bias_refused(tiny: Path) -> None:
    edit_json(tiny / "config.json", attention_bias=True)
    with pytest.raises(ModelLoadError, match="attention_bias=true is not supported"):
        open_model(tiny)


def test_truncated_weights_fail_at_open(tiny: Path) -> None:
    path = tiny / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match="model.safetensors: truncated"):
        open_model(tiny)


def test_index_reads_headers_only(tiny: Path) -> None:
    index = checkpoint_index(tiny)
    assert index["model.embed_tokens.weight"].shape == (300, 32)
    assert all(info.path.name == "model.safetensors" for info in index.values())


def test_display_name_of_hf_snapshot(tmp_path: Path) -> None:
    snap = tmp_path / "models--meta-llama--Llama-3.2-1B-Instruct" / "snapshots" / "abc123"
    write_random_model(snap, TINY)
    assert open_model(snap).name == "meta-llama/Llama-3.2-1B-Instruct"
