"""The `tinychat` command: generate, pull, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weights import ModelConfig, write_random_model

TINY = ModelConfig.from_dict(
    {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 259,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 128,
        "tie_word_embeddings": True,
        "bos_token_id": 257,
        "eos_token_id": 258,
    }
)


def tinychat(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "chat_app.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("models") / "tiny", TINY, seed=1)


def test_generate_json_on_a_random_model(tiny_model):
    r = tinychat(
        "generate", "hello", "--model", str(tiny_model), "--device", "cpu",
        "--max-tokens", "7", "--ignore-eos", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {
        "model",
        "prompt_ids",
        "output_ids",
        "text",
        "finish_reason",
        "tokens_per_s",
    }
    assert len(out["output_ids"]) == 7 and out["finish_reason"] == "length"
    assert out["model"] == "tiny"
    # The chat template wrapped the message (ChatML): more ids than the 5 bytes of "hello".
    assert len(out["prompt_ids"]) > 5


def test_generate_raw_uses_no_template(tiny_model):
    r = tinychat(
        "generate", "hello", "--raw", "--model", str(tiny_model), "--device", "cpu",
        "--max-tokens", "3", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["prompt_ids"][-5:] == list(b"hello")


def corrupt(folder: Path, how: str) -> None:
    if how == "missing folder":
        import shutil

        shutil.rmtree(folder)
    elif how == "not llama":
        cfg = json.loads((folder / "config.json").read_text())
        cfg["model_type"], cfg["architectures"] = "gpt2", ["GPT2LMHeadModel"]
        (folder / "config.json").write_text(json.dumps(cfg))
    elif how == "truncated weights":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif how == "corrupt header":
        data = bytearray((folder / "model.safetensors").read_bytes())
        data[8:20] = b"#not json!!!"
        (folder / "model.safetensors").write_bytes(bytes(data))
    elif how == "tokenizer mismatch":
        cfg = json.loads((folder / "config.json").read_text())
        cfg["vocab_size"] = 100
        (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "how, message",
    [
        ("missing folder", "no such folder"),
        ("not llama", "gpt2"),
        ("truncated weights", "model.safetensors"),
        ("corrupt header", "model.safetensors"),
        ("tokenizer mismatch", "vocab"),
    ],
)
def test_bad_models_fail_with_one_line(tmp_path, how, message):
    folder = write_random_model(tmp_path / "m", TINY, seed=2)
    corrupt(folder, how)
    r = tinychat("generate", "hi", "--model", str(folder), "--device", "cpu", "--max-tokens", "2")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tinychat: error:"), r.stderr
    assert message in lines[0]


def test_missing_shard_fails_with_one_line(tmp_path):
    folder = write_random_model(tmp_path / "sharded", TINY, seed=3, shards=2)
    shard = sorted(folder.glob("model-0000*-of-*.safetensors"))[-1]
    shard.unlink()
    r = tinychat("generate", "hi", "--model", str(folder), "--device", "cpu")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert shard.name in r.stderr


def test_prompt_longer_than_the_context(tiny_model):
    r = tinychat("generate", "x" * 300, "--raw", "--model", str(tiny_model), "--device", "cpu")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "context is 128 tokens" in r.stderr


def test_bad_option_values(tiny_model):
    r = tinychat("generate", "hi", "--model", str(tiny_model), "--temperature", "-1")
    assert r.returncode == 1 and "temperature must be non-negative" in r.stderr


@pytest.mark.slow
def test_generate_streams_a_reply_from_the_default_model(default_model_dir, tinychat_test_home):
    r = tinychat(
        "generate", "What is the capital of France?", "--device", "cpu", "--max-tokens", "20",
        env={"TINYCHAT_HOME": str(tinychat_test_home)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "tok/s" in r.stderr


@pytest.mark.slow
def test_pull_reuses_the_cache(default_model_dir, tinychat_test_home):
    r = tinychat("pull", env={"TINYCHAT_HOME": str(tinychat_test_home)})
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == default_model_dir
    assert "download" not in r.stderr.lower()  # already converted: nothing fetched
