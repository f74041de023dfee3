"""`tinychat bench serve` on the cpu backend, tiny: the engine alone and HTTP clients get the
same tokens, and --check finds every seeded stream whole (its ids the engine's own, its text
their decoding) and, the cpu backend being batch-invariant, equal to its request run alone;
the check itself catches a lost, duplicated or interleaved token."""

from __future__ import annotations

import json

import pytest

from chat_app.cli import main as tinychat_main
from gpu.bench.fixtures import word_tokenizer
from gpu.bench.serve import check_streams

pytestmark = pytest.mark.slow


def test_bench_serve_check_on_random_weights(tmp_path, capsys):
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--config", "smollm2-135m", "--layers", "1", "--device", "cpu",
            "--clients", "3", "--new-tokens", "4", "--prompt-len", "8", "--max-model-len", "64",
            "--max-num-seqs", "4", "--check", "--json", str(out)]  # fmt: skip
    assert tinychat_main(argv) == 0
    results = json.loads(out.read_text())
    # Greedy and the app's defaults (the bench's default --sampling), each on both paths.
    assert list(results["settings"]) == ["greedy", "chat"]
    assert results["sampling"]["chat"] == "temperature 0.7, top-p 0.9, repetition penalty 1.1"
    for setting in results["settings"].values():
        for path in ("engine", "http"):
            assert setting[path]["errors"] == 0
            assert setting[path]["output_tokens"] == setting[path]["expected_tokens"] == 12
        assert setting["http_vs_engine"] > 0
    check = results["check"]
    assert check["ok"] and check["batch_invariant"]
    assert (check["streams"], check["mismatched"], check["differ_from_alone"]) == (3, 0, 0)
    printed = capsys.readouterr().out
    assert "chat      HTTP (tinychat serve)" in printed and "all whole" in printed
    assert "0 differ (the engine is batch-invariant here)" in printed


def _stream(ids: list[int], tok, rid: str = "r0") -> dict:
    return {"id": rid, "token_ids": ids, "text": tok.decode(ids), "completion_tokens": len(ids),
            "error": None}  # fmt: skip


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda ids: ids[:2] + ids[3:], "3 token ids, not 4"),  # lost
        (lambda ids: ids[:2] + ids[1:3], "differ from the engine"),  # duplicated, same length
        (lambda ids: [ids[0], ids[2], ids[1], ids[3]], "differ from the engine"),  # interleaved
    ],
)
def test_the_check_finds_a_lost_duplicated_or_interleaved_token(change, problem):
    tok = word_tokenizer(100)
    engine_ids = [5, 6, 7, 8]
    stream = _stream(change(engine_ids), tok)
    alone = [{"token_ids": engine_ids}]
    c = check_streams([stream], {"r0": engine_ids}, alone, tok, 4, batch_invariant=False)
    assert not c["ok"] and c["mismatched_ids"] == [0] and problem in c["first_problem"]
    text_only = {**_stream(engine_ids, tok), "text": tok.decode([5, 6, 8, 7])}
    c = check_streams([text_only], {"r0": engine_ids}, alone, tok, 4, batch_invariant=False)
    assert not c["ok"] and "decoding of its ids" in c["first_problem"]


def test_a_stream_unlike_its_run_alone_fails_only_where_the_engine_is_batch_invariant():
    tok = word_tokenizer(100)
    streamed = [_stream([1, 2, 3, 4], tok, "a"), _stream([5, 6, 9, 9], tok, "b")]
    engine = {"a": [1, 2, 3, 4], "b": [5, 6, 9, 9]}
    alone = [{"token_ids": [1, 2, 3, 4]}, {"token_ids": [5, 6, 7, 8]}]  # b took another 3rd
    gpu = check_streams(streamed, engine, alone, tok, 4, batch_invariant=False)
    assert gpu["ok"] and gpu["mismatched"] == 0
    assert (gpu["differ_from_alone_ids"], gpu["first_differing_token"]) == ([1], [2])
    cpu = check_streams(streamed, engine, alone, tok, 4, batch_invariant=True)
    assert not cpu["ok"] and cpu["mismatched"] == 0 and cpu["differ_from_alone"] == 1


def test_the_word_tokenizer_decodes_every_id_to_its_own_word():
    tok = word_tokenizer(50_000)
    words = [tok.decode([i]) for i in (0, 1, 1295, 1296, 49_999)]
    assert len(set(words)) == len(words) and all(w.isalnum() for w in words)
    assert tok.decode([5, 6]) == f"{tok.decode([5])} {tok.decode([6])}"


@pytest.mark.gpu
def test_bench_serve_on_the_gpu_loses_and_mixes_no_token(tmp_path):
    """64 seeded streams through HTTP on the cuda backend (random SmolLM2 weights), each whole:
    its token ids (vLLM's return_token_ids) exactly 32 long, equal to what the engine gave that
    request in the same run, and its text their decoding; and the greedy runs deliver every
    token on both paths. Equality with each request run alone is reported but not asserted:
    the GPU engine is not batch-invariant (a batch of 64 runs GEMMs, a batch of one GEMVs, and
    they round differently; tests/device/check_model.py's batch_invariance allows the same), so
    a seeded sample may take another token where its top two were within rounding, with no
    transport fault. Such a stream still has to be whole, which is what the issue asks."""
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--config", "smollm2-135m", "--device", "cuda", "--clients", "64",
            "--new-tokens", "32", "--check", "--json", str(out)]  # fmt: skip
    assert tinychat_main(argv) == 0
    results = json.loads(out.read_text())
    for setting in results["settings"].values():
        for path in ("engine", "http"):
            assert setting[path]["errors"] == 0
            assert setting[path]["output_tokens"] == setting[path]["expected_tokens"] == 64 * 32
    check = results["check"]
    assert check["mismatched"] == 0, check["first_problem"]
    assert check["ok"] and not check["batch_invariant"]


def test_the_server_delivers_every_token_of_a_fast_synthetic_engine():
    """The server's own cost, measured without a model (gpu/bench/serve_synthetic.py): 8
    streams of a token every 2 ms reach the raw-HTTP clients whole, whatever the CPU's load
    (a stream that falls behind gets several tokens an event, never fewer tokens)."""
    from gpu.bench.serve_synthetic import measure

    r = measure(streams=8, tokens=40, period=0.002)
    assert r["tokens_received"] == 8 * 40
    assert 8 <= r["events_s"] * r["wall_s"] <= 8 * 41  # one to 40 text events + a finish each
    assert r["loop_us_per_event"] > 0
