"""`tinychat bench serve` on the cpu backend, tiny: the engine alone and HTTP clients get the
same tokens, and --check finds every seeded stream equal to its request run alone."""

from __future__ import annotations

import json

import pytest

from chat_app.cli import main as tinychat_main
from gpu.bench.serve import word_tokenizer

pytestmark = pytest.mark.slow


def test_bench_serve_check_on_random_weights(tmp_path, capsys):
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--config", "smollm2-135m", "--layers", "1", "--device", "cpu",
            "--clients", "3", "--new-tokens", "4", "--prompt-len", "8", "--max-model-len", "64",
            "--max-num-seqs", "4", "--check", "--json", str(out)]  # fmt: skip
    assert tinychat_main(argv) == 0
    results = json.loads(out.read_text())
    for path in ("engine", "http"):
        assert results[path]["errors"] == 0
        assert results[path]["output_tokens"] == results[path]["expected_tokens"] == 12
    assert results["check"] == {"streams": 3, "mismatched": 0, "mismatched_ids": []}
    printed = capsys.readouterr().out
    assert "HTTP / engine alone" in printed and "all equal" in printed


def test_the_word_tokenizer_decodes_every_id_to_its_own_word():
    tok = word_tokenizer(50_000)
    words = [tok.decode([i]) for i in (0, 1, 1295, 1296, 49_999)]
    assert len(set(words)) == len(words) and all(w.isalnum() for w in words)
    assert tok.decode([5, 6]) == f"{tok.decode([5])} {tok.decode([6])}"


@pytest.mark.gpu
def test_bench_serve_on_the_gpu_loses_and_mixes_no_token(tmp_path):
    """64 seeded streams through HTTP on the cuda backend (random SmolLM2 weights), each equal
    to its request run alone; and the greedy runs deliver every token on both paths."""
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--config", "smollm2-135m", "--device", "cuda", "--clients", "64",
            "--new-tokens", "32", "--check", "--json", str(out)]  # fmt: skip
    assert tinychat_main(argv) == 0
    results = json.loads(out.read_text())
    for path in ("engine", "http"):
        assert results[path]["errors"] == 0
        assert results[path]["output_tokens"] == results[path]["expected_tokens"] == 64 * 32
    assert results["check"]["mismatched"] == 0
