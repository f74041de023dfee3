"""`tinychat bench app --tabs N`: what the app costs the engine, measured on the real app.

    tinychat bench app --device cpu --tabs 2
    tinychat bench app --device cuda --config llama-3.2-1b --tabs 8 --new-tokens 256 --json F

N tabs stream at once, each with a fixed prompt and the app's default sampling
(gpu.sampling_presets.CHAT_DEFAULTS), `--new-tokens` each with ignore_eos, so that every run
does the same work. The runs (`--runs`, in this order):

    core      the engine core (its own process) through its client, with no app
    app-core  the real app through that client
    engine    the in-process engine thread with no app: the reference (every core, as
              `tinychat generate` runs it; the core runs get the app's thread count)
    app       the real app on the in-process engine thread

and, on request only, the app's own cost with no model and no GPU (gpu/bench/standin_core.py):

    synthetic      a stand-in core (a process that sends a token per request every 1.5 ms,
                   ~5,300 tok/s at 8 tabs) through the real client, with no app
    app-synthetic  the real app through that client

    tinychat bench app --tabs 8 --new-tokens 256 --runs synthetic,app-synthetic

The app runs headless (Textual's `run_test` at 160x50): the same widgets, layout and Markdown
as on a terminal, only the final write to the terminal is skipped. The last tab opened is the
one shown, as when a user watches one tab while the others stream. The core runs go first:
their process has the device to itself, then exits before this process builds its engine.
With --config, the random weights are written to a model folder once, with a tokenizer that
decodes every id to a word (one in 64 opens a paragraph) and the built-in ChatML template (the
app needs text to render and a chat template, and the core loads a model by path), and every
run loads that folder: the same weights, the same sampling work.

Each run reports the tokens received over the wall time from queuing the first request to the
last token received (tok/s); the stream's rate, from the first token received to the last
(stream: what the app costs a stream, its start-up aside; see RunResult); and the gaps between
arrivals of new tokens at each tab's sink, pooled over the tabs (p50, p99; tokens that arrive
together count once): for the app that is the pane, on the UI thread, where a frame's
coalesced tokens arrive; with no app it is the engine's output callback, a token a step.
`x engine` is a run's stream rate over the engine run's (the core's, or the synthetic
core's, where that is the reference in the run); CPU is this process's CPU seconds per
second of the run (with the core, the app's own cost), and per 1,000 tokens received (steady
on a busy machine, where the wall time is not).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chat_app.bench_app_results import Arrivals, RunResult, add_ratios, print_report
from gpu.bench import fixtures, standin_core
from gpu.bench.fixtures import engine_config

if TYPE_CHECKING:
    from chat_app.engine_api import EngineThread, OutputCallback
    from gpu.outputs import EngineStats, RequestOutput
    from gpu.sampling_params import SamplingParams

RUNS = ("synthetic", "app-synthetic", "core", "app-core", "engine", "app")
DEFAULT_RUNS = ("core", "app-core", "engine", "app")
SIZE = (160, 50)
PARAGRAPH = 64  # one word in 64 opens a paragraph: the app's Markdown gets blocks to lay out
PROMPTS = (
    "Explain how a hash map handles collisions, with a short example in Python.",
    "Write a haiku about the sea, then explain its imagery line by line.",
    "What are the main differences between TCP and UDP? Use a table.",
    "Summarise the plot of a heist film you would like to see, in five paragraphs.",
    "Give me a recipe for a vegetable soup, with the steps as a numbered list.",
    "How does a CPU cache work? Explain it to a curious twelve-year-old.",
    "List ten ideas for a weekend project that teaches something about electronics.",
    "Compare three ways to sort a list and say when each one is the right choice.",
)


def add_bench_app_arguments(parser: argparse.ArgumentParser) -> None:
    """The app workload's options (the bench's others: --model/--config, --device,
    --new-tokens, --json, the engine's sizes)."""
    group = parser.add_argument_group("the app workload (tinychat bench app)")
    group.add_argument("--tabs", type=int, default=1, help="tabs streaming at once (app)")
    group.add_argument(
        "--runs",
        default=None,
        help=f"comma-separated, of {', '.join(RUNS)} (default: {', '.join(DEFAULT_RUNS)}; "
        "--config's random weights are written to a model folder once, which every run "
        "loads; synthetic and app-synthetic need no model: a stand-in core)",
    )


class FixedWork:
    """An EngineThread (chat_app.engine_api's protocol) whose every request generates exactly
    `max_tokens`: the app's own settings choose the sampling, this makes the length fixed.

    It starts its thread once and stops it once, so that one warmed-up engine serves the
    run without the app and then the app (which starts the thread it is given, and stops it
    when it quits)."""

    def __init__(self, thread: EngineThread, max_tokens: int) -> None:
        self.thread = thread
        self.engine = thread.engine
        self.max_tokens = max_tokens
        self._started = self._stopped = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.thread.start()

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        on_output: OutputCallback,
        request_id: str | None = None,
    ) -> str:
        params = dataclasses.replace(params, max_tokens=self.max_tokens, ignore_eos=True)
        return self.thread.add_request(prompt, params, on_output, request_id=request_id)

    def abort(self, request_id: str) -> None:
        self.thread.abort(request_id)

    def stats(self) -> EngineStats:
        return self.thread.stats()

    def shutdown(self, timeout: float = 5.0) -> None:
        if self._started and not self._stopped:
            self._stopped = True
            self.thread.shutdown(timeout)


def prompts_for(tabs: int) -> list[str]:
    return [PROMPTS[i % len(PROMPTS)] for i in range(tabs)]


def run_engine_alone(work: FixedWork, tabs: int, run: str) -> RunResult:
    """The same requests as the app's tabs, straight into the engine (started here if it is
    not yet, left running): outputs are timed in the engine's callback."""
    from gpu.sampling_params import RequestOutputKind
    from gpu.sampling_presets import chat_sampling_params

    tokenizer = work.engine.tokenizer
    params = chat_sampling_params(output_kind=RequestOutputKind.DELTA)
    arrivals = Arrivals()
    done = threading.Semaphore(0)
    errors: list[str] = []

    def sink(tab: str) -> Callable[[RequestOutput], None]:
        def on_output(output: RequestOutput) -> None:
            completion = output.outputs[0] if output.outputs else None
            arrivals.record(
                tab,
                len(completion.token_ids) if completion else 0,
                completion.text if completion else "",
            )
            if output.finished:
                if output.error:
                    errors.append(output.error)
                done.release()

        return on_output

    work.start()
    prompt_ids = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
        )
        for prompt in prompts_for(tabs)
    ]
    arrivals.begin()
    for n, ids in enumerate(prompt_ids, 1):
        work.add_request(ids, params, sink(f"tab-{n}"))
    for _ in range(tabs):
        done.acquire()
    if errors:
        raise RuntimeError(f"the engine failed a request: {errors[0]}")
    return arrivals.result(run, tabs, tabs * work.max_tokens)


def run_app(work: FixedWork, tabs: int, run: str) -> RunResult:
    """The real app, headless, on `work` (stopped when the app quits), `tabs` tabs sending at
    once; tokens are timed at each pane. The app runs on a thread of its own, as on a
    terminal it has one to itself: its UI thread gives a CPU engine the cores first
    (chat_app/ui_priority.py), for good, and the runs after it must not inherit that."""
    with ThreadPoolExecutor(1, thread_name_prefix="tinychat-bench-ui") as ui:
        return ui.submit(asyncio.run, _run_app(work, tabs, run)).result()


async def _run_app(work: FixedWork, tabs: int, run: str) -> RunResult:
    from chat_app.app import TinyChatApp
    from chat_app.bridge import StreamUpdate
    from chat_app.history import HistoryStore
    from chat_app.session import ChatSettings

    arrivals = Arrivals()
    with tempfile.TemporaryDirectory(prefix="tinychat-bench-app-") as home:
        store = HistoryStore.open(Path(home) / "history.db")  # the app saves as it streams
        app = TinyChatApp(
            lambda: work,
            store,
            defaults=ChatSettings(max_tokens=work.max_tokens),
            fresh=True,
            export_dir=Path(home) / "exports",
            yield_to_cpu_engine=True,
        )
        try:
            async with app.run_test(size=SIZE) as pilot:
                await _until(lambda: app.client.ready or app.client.load_error is not None)
                if app.client.load_error is not None:
                    raise RuntimeError(f"the engine failed to load: {app.client.load_error}")
                screen = app.chat_screen
                while len(screen.panes) < tabs:
                    await screen.action_new_chat()
                await pilot.pause()
                panes = screen.panes
                for pane in panes:  # time each update where the pane receives it
                    receive = pane.on_stream_update

                    async def timed(update: StreamUpdate, tab=pane.id, receive=receive) -> None:
                        arrivals.record(tab or "", update.num_tokens, update.text)
                        await receive(update)

                    pane.on_stream_update = timed  # type: ignore[method-assign]
                arrivals.begin()
                # Every tab sends at once, as the runs without the app queue every request at
                # once: one after another, each send would wait for its widgets to mount (a
                # frame) before the next tab's request is queued, and the batch would fill
                # only by steps.
                await asyncio.gather(
                    *(pane.send(p) for pane, p in zip(panes, prompts_for(tabs), strict=True))
                )
                await _until(lambda: not any(pane.replying for pane in panes), timeout=3600)
                result = arrivals.result(run, tabs, tabs * work.max_tokens)
                failed = [
                    m.error for p in panes for m in p.session.messages if m.finish_reason == "error"
                ]
                if failed:
                    raise RuntimeError(f"a reply failed: {failed[0]}")
                await app.action_quit()
        finally:
            store.close()
    return result


async def _until(condition: Callable[[], bool], timeout: float = 600.0) -> None:
    """Poll without waking the UI more than a timer would."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not finish in time")
        await asyncio.sleep(0.02)


def bench_engine(
    thread: EngineThread, tabs: int, new_tokens: int, runs: list[str], names: tuple[str, str]
) -> list[RunResult]:
    """One engine (an in-process engine thread, or an engine-core client) for the run without
    the app and the run with it (names), after short warm-up passes of the same requests
    (caches, the prefix cache; on a GPU, every batch size up to `tabs`, since the app's tabs
    start one after another and each batch size captures its graph the first time). Stops
    the engine at the end."""
    alone, in_app = names
    results = []
    work = FixedWork(thread, min(new_tokens, 16))
    try:
        for batch in range(1, tabs + 1) if work.engine.device == "cuda" else [tabs]:
            run_engine_alone(work, batch, "warm-up")
        work.max_tokens = new_tokens
        if alone in runs:
            results.append(run_engine_alone(work, tabs, alone))
        if in_app in runs:
            results.append(run_app(work, tabs, in_app))
    finally:
        work.shutdown()
    return results


def core_client(args: argparse.Namespace) -> EngineThread:
    """An engine-core client (it spawns the core, which loads the model the arguments name),
    configured as the app configures its own: on the cpu, every core but the UI's."""
    from chat_app.launch import app_cpu_threads
    from gpu.engine_core import EngineCoreClient

    progress = getattr(args, "progress", None)  # the command line's bar
    config = engine_config(args)
    config.cpu_threads = app_cpu_threads()
    client = EngineCoreClient(args.model, args.device, config, progress=progress)
    if hasattr(progress, "finish"):
        progress.finish()
    return client


def synthetic_client(args: argparse.Namespace) -> EngineThread:
    """An engine-core client on the stand-in core (gpu/bench/standin_core.py)."""
    from gpu.engine_core import EngineCoreClient

    folder = synthetic_model_folder(Path(tempfile.gettempdir()) / "tinychat-bench-app-synthetic")
    return EngineCoreClient(str(folder), "cpu", engine_config(args), entry=standin_core.ENTRY)


def synthetic_model_folder(
    folder: Path, vocab_size: int = 32_000, step_s: float | None = None
) -> Path:
    """The stand-in core's model folder, its words opening a paragraph one in PARAGRAPH (the
    app's Markdown gets blocks to lay out)."""
    return standin_core.model_folder(folder, vocab_size, step_s, paragraph=PARAGRAPH)


def _core_available() -> bool:
    try:
        import gpu.engine_core  # noqa: F401
    except ImportError:
        return False
    return True


def choose_runs(args: argparse.Namespace) -> list[str]:
    if args.runs:
        runs = [r.strip() for r in args.runs.split(",") if r.strip()]
        unknown = set(runs) - set(RUNS)
        if unknown:
            raise ValueError(f"unknown run(s) {', '.join(sorted(unknown))}: use {', '.join(RUNS)}")
        return [r for r in RUNS if r in runs]
    with_core = _core_available()
    return [r for r in DEFAULT_RUNS if with_core or r not in ("core", "app-core")]


def build_engine(args: argparse.Namespace) -> tuple[Any, str]:
    """The in-process engine for the model the arguments name, and its label."""
    from gpu.loader import create_engine

    progress = getattr(args, "progress", None)  # the command line's bar
    engine = create_engine(args.model, args.device, engine_config(args), progress=progress)
    if hasattr(progress, "finish"):
        progress.finish()
    return engine, args.model or "default"


def run_bench_app(
    args: argparse.Namespace,
    build: Callable[[argparse.Namespace], tuple[Any, str]] = build_engine,
) -> int:
    """`tinychat bench app`: the runs, a table, and --json."""
    from gpu.sampling_presets import CHAT_DEFAULTS

    if args.tabs < 1:
        raise ValueError("--tabs must be at least 1")
    runs = choose_runs(args)
    results: list[RunResult] = []
    label = None
    if args.config is not None:
        label = f"{args.config} (random bf16 weights)"
        # The app needs a tokenizer and a chat template, and the core loads a model by path.
        folder = fixtures.cached_random_model_folder(args.config, args.layers, PARAGRAPH)
        args = argparse.Namespace(**{**vars(args), "model": str(folder), "config": None})
    if {"synthetic", "app-synthetic"} & set(runs):
        client = synthetic_client(args)
        label = label or "synthetic core (no model)"
        results += bench_engine(
            client, args.tabs, args.new_tokens, runs, ("synthetic", "app-synthetic")
        )
    if {"core", "app-core"} & set(runs):
        client = core_client(args)
        results += bench_engine(client, args.tabs, args.new_tokens, runs, ("core", "app-core"))
    engine = None
    if {"engine", "app"} & set(runs):
        from gpu.engine_thread import EngineThread

        engine, built = build(args)
        label = label or built
        thread = EngineThread(engine)
        results += bench_engine(thread, args.tabs, args.new_tokens, runs, ("engine", "app"))
    add_ratios(results)
    report = {
        "workload": "app",
        "model": label or args.config or args.model or "default",
        "device": engine.device if engine is not None else args.device,
        "tabs": args.tabs,
        "new_tokens": args.new_tokens,
        "sampling": CHAT_DEFAULTS.describe(),
        "size": list(SIZE),
        "runs": [dataclasses.asdict(r) for r in results],
    }
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=1)
    print_report(report)
    return 0
