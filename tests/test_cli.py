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


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tinychat: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    "option, value", [("--temperature", "inf"), ("--top-p", "nan"), ("--repetition-penalty", "inf")]
)
def test_non_finite_sampling_values_are_refused(tiny_model, option, value):
    r = tinychat("generate", "hi", "--model", str(tiny_model), "--device", "cpu", option, value)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    name = option[2:].replace("-", "_")
    assert (
        one_error_line(r.stderr) == f"tinychat: error: {name} must be a finite number, got {value}"
    )


@pytest.fixture
def app_runs(monkeypatch, tmp_path) -> list:
    """`tinychat` (the app) up to the point the UI would open: the runs it would have made."""
    import chat_app.launch

    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "home"))
    runs: list = []

    def run_app(args):
        runs.append(args)
        return 0

    monkeypatch.setattr(chat_app.launch, "run_app", run_app)
    return runs


def test_the_app_refuses_bad_sampling_values_before_it_opens(tiny_model, app_runs, capsys):
    from chat_app.cli import main

    assert main(["--model", str(tiny_model), "--temperature", "inf"]) == 1
    assert app_runs == []
    err = one_error_line(capsys.readouterr().err)
    assert err == "tinychat: error: temperature must be a finite number, got inf"


def test_resume_of_a_missing_chat_is_a_command_line_error(tiny_model, app_runs, capsys):
    from chat_app.cli import main
    from chat_app.history import HistoryStore

    store = HistoryStore.open()
    chat_id = store.create_session("kept", "{}")
    store.close()
    assert main(["--model", str(tiny_model), "--resume", str(chat_id + 998)]) == 1
    assert app_runs == []
    err = one_error_line(capsys.readouterr().err)
    assert err.startswith(f"tinychat: error: no chat {chat_id + 998} in the history")
    assert main(["--model", str(tiny_model), "--resume", str(chat_id)]) == 0
    assert [args.resume for args in app_runs] == [chat_id]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
        (["--top-k", "x"], "argument --top-k: invalid int value: 'x'"),
        (["generate", "hi", "--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
        (["bench", "--max-num-seqs", "many"], "argument --max-num-seqs: invalid int value"),
    ],
)
def test_a_bad_option_value_exits_1_with_one_line(argv, message, capsys):
    """The README's promise: a bad option value is one `tinychat: error:` line, status 1."""
    from chat_app.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 1
    assert one_error_line(capsys.readouterr().err).startswith(f"tinychat: error: {message}")


@pytest.mark.parametrize(
    "argv", [["--bogus"], ["--resume"], ["generate"], ["frobnicate"], ["generate", "hi", "-x"]]
)
def test_a_command_line_argparse_cannot_read_keeps_its_usage_and_status_2(argv, capsys):
    from chat_app.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "usage: tinychat" in capsys.readouterr().err


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


def test_a_reader_that_leaves_stops_tinychat_quietly(tmp_path):
    """`tinychat history | head -c 1`: the pipe closes under the writer, which stops
    quietly with 141 (128 + SIGPIPE), not with "tinychat: error: [Errno 32] Broken pipe"."""
    script = (
        "import sys; from chat_app import cli\n"
        "def flood(args):\n"
        "    while True:\n"
        "        sys.stdout.write('x' * 65536); sys.stdout.flush()\n"
        "cli.COMMANDS['history'] = flood\n"
        "sys.exit(cli.main(['history']))\n"
    )
    env = {**os.environ, "TINYCHAT_HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    proc.stdout.read(1)
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141, err
    assert b"Broken pipe" not in err and b"Traceback" not in err, err
