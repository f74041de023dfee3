"""`tinychat bench` runs end to end (on the cpu backend, tiny sizes) and writes its JSON.

Speed is never asserted here: the figures come from the device (BENCHMARKS.md)."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

import pytest

from chat_app.cli import main
from chat_app.launch import add_app_arguments
from chat_app.session import ChatSettings
from gpu.bench import warm_up_plan, workloads
from gpu.bench.sampling import SETTINGS, parse_sampling
from gpu.bench.standin import standin_engine
from gpu.sampling_params import SamplingParams
from gpu.sampling_presets import CHAT_DEFAULTS, CHAT_MAX_TOKENS, chat_sampling_params

TINY = ["--config", "smollm2-135m", "--layers", "1", "--device", "cpu", "--max-num-seqs", "8"]


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
    # The default sampling: greedy and the app's defaults, side by side.
    assert [(x["batch_size"], x["sampling"]) for x in r["latency"]] == [
        (1, "greedy"),
        (1, "chat"),
    ]
    assert all(x["decode_tok_s"] > 0 and x["floor_ms"] > 0 for x in r["latency"])
    assert [(x["batch_size"], x["sampling"]) for x in r["decode"]] == [
        (1, "greedy"),
        (1, "chat"),
        (2, "greedy"),
        (2, "chat"),
    ]
    t = r["throughput"]
    assert t["output_tokens"] > 0
    # Every step filed once, by the step it waited for: 4 prompts (each chunked at most twice),
    # then decode steps of 1-4 sequences; their seconds add up to no more than the run.
    assert 1 <= t["mixed_steps"] <= 8 and t["decode_steps"] >= 1
    assert 1 <= t["mean_decode_batch"] <= 4
    assert 0 < t["decode_s"] + t["mixed_s"] <= t["total_time_s"]
    assert r["chat"]["sessions"] == 2 and r["chat"]["ttft_p50_ms"] > 0
    table = capsys.readouterr().out
    assert "latency b1 greedy" in table and "decode b2 chat" in table
    assert f"{t['decode_steps']} decode" in table


def test_bench_sampling_all_reports_every_row_beside_greedy(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(
        ["bench", "latency", "decode", *TINY, "--batches", "1,2", "--new-tokens", "4",
         "--sampling", "all", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    r = json.loads(out.read_text())
    assert list(r["sampling"]) == list(SETTINGS)
    assert r["sampling"]["chat"] == "temperature 0.7, top-p 0.9, repetition penalty 1.1"
    expected = [(b, name) for b in (1, 2) for name in SETTINGS]
    assert [(x["batch_size"], x["sampling"]) for x in r["decode"]] == expected
    assert [x["sampling"] for x in r["latency"]] == list(SETTINGS)
    table = capsys.readouterr().out
    for rows in (r["latency"], r["decode"]):
        greedy = {x["batch_size"]: x["decode_tok_s"] for x in rows if x["sampling"] == "greedy"}
        for x in rows:
            assert x["decode_tok_s"] > 0
            assert x["vs_greedy"] == pytest.approx(x["decode_tok_s"] / greedy[x["batch_size"]])
    for x in r["decode"]:  # each row named, with its ratio, in the table
        name = f"decode b{x['batch_size']} {x['sampling']}"
        line = next(line for line in table.splitlines() if line.startswith(name + " "))
        assert f"{x['vs_greedy']:.2f}x" in line
    # Warm-up on the cpu backend: batch 1 of each setting, never the larger batches.
    assert r["warmup_s"] >= 0


def test_bench_sampling_names_are_checked():
    assert parse_sampling("chat,greedy") == ["greedy", "chat"]
    assert parse_sampling("all") == list(SETTINGS)
    with pytest.raises(ValueError, match="top-q"):
        parse_sampling("greedy,top-q")


def test_a_non_greedy_row_without_greedy_has_no_ratio(tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", "latency", *TINY, "--new-tokens", "3", "--sampling", "min-p"]
    assert main([*args, "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["latency"]
    assert row["sampling"] == "min-p" and row["vs_greedy"] is None


def test_the_chat_setting_is_the_apps_defaults():
    """One definition: the app's new chats, its command-line defaults, the bench's "chat"
    rows and the chat workload's requests all sample with CHAT_DEFAULTS."""
    import argparse

    assert SETTINGS["chat"] == CHAT_DEFAULTS
    app = ChatSettings().sampling_params()
    preset = chat_sampling_params()
    for f in fields(SamplingParams):
        if f.init and f.name != "output_kind":
            assert getattr(app, f.name) == getattr(preset, f.name), f.name
    assert app.max_tokens == CHAT_MAX_TOKENS
    assert (app.temperature, app.top_p, app.repetition_penalty) == (0.7, 0.9, 1.1)
    parser = argparse.ArgumentParser()
    add_app_arguments(parser)
    args = parser.parse_args([])
    for name, value in asdict(CHAT_DEFAULTS).items():
        if hasattr(args, name):
            assert getattr(args, name) == value, name
    session = workloads._Session(None, 0.0, 1, seed=3, reply_len=9)
    params = session.params(turn=2)
    assert all(getattr(params, k) == v for k, v in asdict(CHAT_DEFAULTS).items())
    assert params.max_tokens == 9 and params.seed == 3002


def test_warm_up_runs_only_what_the_workloads_run():
    settings = ["greedy", "chat"]
    # The latency workload warms batch 1 alone, whatever --batches says.
    assert warm_up_plan(["latency"], [1, 8, 64, 256], settings, "cuda") == [
        (1, "greedy"),
        (1, "chat"),
    ]
    decode = warm_up_plan(["decode"], [8, 64], ["chat"], "cuda")
    assert decode == [(8, "chat"), (64, "chat")]
    chat = warm_up_plan(["chat"], [1, 8, 64, 256], settings, "cuda", sessions=8)
    assert chat == [(1, "chat"), (8, "chat")]
    # On the cpu backend nothing compiles: batch 1 of each setting.
    assert warm_up_plan(["latency", "decode"], [1, 8, 64, 256], settings, "cpu") == [
        (1, "greedy"),
        (1, "chat"),
    ]


def test_bench_startup_reports_cold_and_warm(tmp_path):
    """Two fresh processes on one pair of cache folders, each reporting ready and its first
    token. On float32 weights: what the cold process did for q8 was compile its Numba kernels
    (55-90 s of this test on the 2-core CI host, 3 s now), which the bench measures but does not
    shape; test_cpu_quant_decode checks that compile happens before ready."""
    out = tmp_path / "bench.json"
    args = ["bench", "startup", *TINY, "--precision", "float32", "--json", str(out)]
    assert main(args) == 0
    r = json.loads(out.read_text())["startup"]
    for run in ("cold", "warm"):
        assert 0 <= r[run]["ready_s"] <= r[run]["first_token_s"]
        assert r[run]["device"] == "cpu"


def test_bench_scheduler_overhead_has_a_row_per_sampling_setting(capsys):
    assert main(["bench", "scheduler", "--sampling", "greedy,top-p"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [r[:2] for r in rows if r and r[0] == "256"] == [["256", "greedy"], ["256", "top-p"]]


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
