"""`tinychat bench app` end to end on a tiny random model: the engine alone and the real app
(headless), 2 tabs, and the JSON it writes."""

from __future__ import annotations

import json
from pathlib import Path

from engine_helpers import tiny_engine

from chat_app.bench_app import run_bench_app
from chat_app.cli import build_parser


def test_bench_app_runs_the_engine_and_the_app_and_writes_sane_json(tmp_path: Path) -> None:
    out = tmp_path / "app.json"
    args = build_parser().parse_args(
        ["bench", "app", "--device", "cpu", "--tabs", "2", "--new-tokens", "64"]
        + ["--runs", "engine,app", "--json", str(out)]
    )
    assert run_bench_app(args, build=lambda _: (tiny_engine(), "tiny-random")) == 0
    report = json.loads(out.read_text())
    assert report["tabs"] == 2 and report["new_tokens"] == 64
    assert report["sampling"] == "temperature 0.7, top-p 0.9, repetition penalty 1.1"
    runs = {r["run"]: r for r in report["runs"]}
    assert list(runs) == ["engine", "app"]
    for r in runs.values():
        assert r["tokens"] == r["tokens_requested"] == 128  # ignore_eos: the same work each run
        assert r["tok_s"] > 0 and r["stream_tok_s"] > 0 and r["wall_s"] > 0
        assert 0 <= r["gap_p50_ms"] <= r["gap_p99_ms"] <= r["gap_max_ms"]
        assert r["tokens_per_arrival"] >= 1
        assert r["process_cpu"] > 0
        assert r["chars"] > 0  # text to render, not only ids
    assert runs["engine"]["x_engine"] == 1.0
    assert runs["engine"]["tokens_per_arrival"] == 1  # the engine's callback: a token a step
    assert runs["engine"]["gap_p50_ms"] > 0
    # The app's tabs take what arrived since their last frame, and its UI thread yields the
    # cores to a CPU engine (nice 10): on a busy host a tab may get its 64 tokens in one frame,
    # with no gap between arrivals to measure.
    if runs["app"]["tokens_per_arrival"] < 64:
        assert runs["app"]["gap_max_ms"] > 0
    app, engine = runs["app"], runs["engine"]
    assert app["x_engine"] == app["stream_tok_s"] / engine["stream_tok_s"]


def test_bench_app_synthetic_runs_need_no_model(tmp_path: Path) -> None:
    """The stand-in core (a process that sends tokens, no model) through the real client,
    without and with the app: what the app's side of streaming costs, on any machine."""
    out = tmp_path / "synthetic.json"
    args = build_parser().parse_args(
        ["bench", "app", "--tabs", "2", "--new-tokens", "32"]
        + ["--runs", "synthetic,app-synthetic", "--json", str(out)]
    )
    assert run_bench_app(args) == 0
    runs = {r["run"]: r for r in json.loads(out.read_text())["runs"]}
    assert list(runs) == ["synthetic", "app-synthetic"]
    for r in runs.values():
        assert r["tokens"] == r["tokens_requested"] == 64
        assert r["chars"] > 0 and r["cpu_ms_per_1k_tokens"] > 0
    assert runs["synthetic"]["x_engine"] == 1.0  # the reference where no engine ran
