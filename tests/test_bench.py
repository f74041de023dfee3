"""`tinychat bench` runs end to end (on the cpu backend, tiny sizes) and writes its JSON.

Speed is never asserted here: the figures come from the device (BENCHMARKS.md)."""

from __future__ import annotations

import json

from chat_app.cli import main
from gpu.bench import workloads
from gpu.bench.standin import standin_engine
from gpu.sampling_params import SamplingParams


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
    t = r["throughput"]
    assert t["output_tokens"] > 0
    # Every step filed once, by the step it waited for: 4 prompts (each chunked at most twice),
    # then decode steps of 1-4 sequences; their seconds add up to no more than the run.
    assert 1 <= t["mixed_steps"] <= 8 and t["decode_steps"] >= 1
    assert 1 <= t["mean_decode_batch"] <= 4
    assert 0 < t["decode_s"] + t["mixed_s"] <= t["total_time_s"]
    assert r["chat"]["sessions"] == 2 and r["chat"]["ttft_p50_ms"] > 0
    table = capsys.readouterr().out
    assert "latency (batch 1)" in table and "decode batch 2" in table
    assert f"{t['decode_steps']} decode" in table


def test_bench_scheduler_overhead(capsys):
    assert main(["bench", "scheduler"]) == 0
    assert "us/seq" in capsys.readouterr().out


def test_the_step_timer_files_a_call_by_the_step_it_waits_for():
    """With async scheduling the call that launches the first decode waits for the prefill:
    it is a prompt step's wall time, not a decode step's."""
    engine = standin_engine(decode_ms=0.1, launch_us=0.0)
    timer = workloads._StepTimer(engine)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, detokenize=False)
    engine.add_request(list(range(1, 40)), params)
    while engine.has_unfinished_requests():
        engine.step()
    timer.close()
    assert len(timer.mixed) == 2  # the prefill's launch, then the wait for it
    assert len(timer.decode) >= 4


def test_the_gpu_stand_in_takes_its_device_time_per_step():
    """The stand-in executor's steps last decode_ms (slept, not spun): the chat workload on it
    streams at that pace, which is what makes it a reproduction of the GPU's."""
    engine = standin_engine(decode_ms=2.0, launch_us=0.0)
    r = workloads.chat_run(engine, sessions=2, turns=1, arrival_s=0.0, long_prompt=100)
    assert r.itl_p50_ms >= 1.9 and r.single_itl_p50_ms >= 1.9
    assert r.decode_step_p50_ms >= 1.5
