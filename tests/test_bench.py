"""`tinychat bench` runs end to end (on the cpu backend, tiny sizes) and writes its JSON.

Speed is never asserted here: the figures come from the device (BENCHMARKS.md)."""

from __future__ import annotations

import json

from chat_app.cli import main


def test_bench_writes_every_workload(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench", "--config", "smollm2-135m", "--layers", "1", "--device", "cpu",
            "--batches", "1,2", "--new-tokens", "6", "--num-requests", "4", "--min-len", "10",
            "--max-len", "30", "--sessions", "2", "--turns", "2", "--long-prompt", "100",
            "--max-num-seqs", "8", "--json", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    r = json.loads(out.read_text())
    assert r["device"] == "cpu" and r["params"] > 0
    assert r["latency"]["decode_tok_s"] > 0 and r["latency"]["floor_ms"] > 0
    assert [row["batch_size"] for row in r["decode"]] == [1, 2]
    assert r["throughput"]["output_tokens"] > 0
    assert r["chat"]["sessions"] == 2 and r["chat"]["ttft_p50_ms"] > 0
    table = capsys.readouterr().out
    assert "latency (batch 1)" in table and "decode batch 2" in table


def test_bench_scheduler_overhead(capsys):
    assert main(["bench", "scheduler"]) == 0
    assert "us/seq" in capsys.readouterr().out
