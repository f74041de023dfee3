"""Where the chat workload's ITL tail goes, on the GPU stand-in (no GPU needed).

Runs `chat_run` on `gpu.bench.standin` with each phase of the engine thread's loop timed
(perf_counter wrappers on the instance: applying commands, scheduling, launching, waiting for
the step's ids, processing them, delivering to the clients), plus the lateness of each wait:
how long after the simulated step ended the engine thread got the GIL back. Prints the phase
medians and the phases of the slowest decode steps.

    python tests/device/chat_tail.py --sessions 8 --repeats 3
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from gpu.bench import standin
from gpu.bench.workloads import chat_run
from gpu.engine_thread import EngineThread


class PhaseTimer:
    """Accumulates named phase times into the current engine-loop iteration's record."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.records: list[dict[str, float]] = []

    def wrap(self, obj: object, name: str, label: str | None = None) -> None:
        fn = getattr(obj, name)
        key = label or name

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[key] += time.perf_counter() - t0

        setattr(obj, name, timed)

    def end_iteration(self, **extra: float) -> None:
        self.current.update(extra)
        self.records.append(dict(self.current))
        self.current = defaultdict(float)


class _TimedHandle:
    """A launched step's handle whose result() is timed: the wait, and (on the stand-in) how
    long after the simulated step ended the engine thread got the GIL back."""

    def __init__(self, handle, timer: PhaseTimer) -> None:
        self.handle, self.timer = handle, timer

    def result(self):
        t0 = time.perf_counter()
        out = self.handle.result()
        t1 = time.perf_counter()
        self.timer.current["wait"] += t1 - t0
        deadline = getattr(self.handle, "deadline", None)
        if deadline is not None:
            self.timer.current["late"] += max(0.0, t1 - deadline)  # GIL + OS wake-up
        return out


def instrument(engine, timer: PhaseTimer) -> None:
    """Time the phases of every engine.step() (on the instance) and of the engine thread."""
    timer.wrap(engine.scheduler, "schedule")
    timer.wrap(EngineThread, "_apply_commands")  # class level: the instance is made in chat_run
    timer.wrap(EngineThread, "_deliver")
    init = EngineThread.__init__

    def init_and_time_idle_waits(et, *args, **kwargs):
        init(et, *args, **kwargs)
        timer.wrap(et._wake, "wait", "idle wait")  # the loop found nothing to do

    EngineThread.__init__ = init_and_time_idle_waits
    launch, process = engine.runner.launch, engine._process

    def timed_launch(sched):
        t0 = time.perf_counter()
        sampled, handle, md = launch(sched)
        timer.current["launch"] += time.perf_counter() - t0
        timer.current["launched_prompt_tokens"] = sched.num_prefill_tokens
        return sampled, _TimedHandle(handle, timer), md

    def timed_process(step):
        t0 = time.perf_counter()
        out = process(step)
        timer.current["process (incl. wait)"] += time.perf_counter() - t0
        timer.current["processed_prompt_tokens"] = step.sched.num_prefill_tokens
        return out

    engine.runner.launch, engine._process = timed_launch, timed_process
    step = engine.step

    def timed_step():
        t0 = time.perf_counter()
        out = step()
        timer.end_iteration(step=time.perf_counter() - t0, batch=engine.last_step.batch_size)
        return out

    engine.step = timed_step


def _row(label: str, records: list[dict], key: str = "step") -> str:
    v = np.array([r.get(key, 0.0) for r in records]) * 1e3
    if not len(v):
        return f"{label:<44}{0:>6}"
    return (
        f"{label:<44}{len(v):>6}{np.percentile(v, 50):>8.3f}{np.percentile(v, 99):>8.3f}"
        f"{v.max():>8.3f}"
    )


def report(timer: PhaseTimer, min_batch: int = 2) -> None:
    """Step wall times split by what the step launched and what it waited for, then the
    phases of the steps that launch decodes, the slowest 1% beside the median."""
    steps = [r for r in timer.records if r.get("batch", 0) >= min_batch]
    decode = [r for r in steps if not r.get("launched_prompt_tokens")]
    after_decode = [r for r in decode if not r.get("processed_prompt_tokens")]
    after_mixed = [r for r in decode if r.get("processed_prompt_tokens")]
    print(f"{'engine.step() wall ms':<44}{'n':>6}{'p50':>8}{'p99':>8}{'max':>8}")
    print(_row("launches decodes (the old bench's 'decode')", decode))
    print(_row("  ... and waits for decodes", after_decode))
    print(_row("  ... and waits for a prompt step", after_mixed))
    print(_row("launches prompt tokens", [r for r in steps if r not in decode]))
    if not decode:
        return
    cut = np.percentile([r["step"] for r in decode], 99)
    slow = [r for r in decode if r["step"] > cut]
    keys = sorted({k for r in decode for k in r} - {"batch"})
    print(f"phases of the steps launching decodes: {'p50':>8}{'p99':>8}{'slowest 1% mean':>17}")
    for k in keys:
        v = np.array([r.get(k, 0.0) for r in decode])
        s = np.mean([r.get(k, 0.0) for r in slow])
        scale = 1.0 if k.endswith("tokens") else 1e3  # token counts as they are, times in ms
        print(
            f"  {k:<34}{scale * np.percentile(v, 50):>8.3f}{scale * np.percentile(v, 99):>8.3f}"
            f"{scale * s:>17.3f}"
        )


def _engine(args: argparse.Namespace):
    """The stand-in engine, or (--device cuda) the bench's engine, warmed up as the bench does."""
    if args.device == "standin":
        return standin.standin_engine(args.decode_ms, args.launch_us, args.prefill_us)
    from gpu.bench import _build, add_bench_arguments, workloads

    bench = argparse.ArgumentParser()
    add_bench_arguments(bench)
    engine = _build(bench.parse_args(["--config", args.config, "--device", args.device]))[0]
    engine.runner.executor.capture_all()  # as --capture-at-start: no capture while timed
    workloads.warm_up(engine, [1, 8])
    return engine


def mixed_replay_ms(engine, seqs: int = 8, reps: int = 20) -> dict[int, float]:
    """GPU ms of one replay of each captured greedy mixed graph of `seqs` sequences, by token
    bucket (cuda only; rewrites the KV of the last step's slots: run when nothing is live)."""
    from numba import cuda

    executor = engine.runner.executor
    stream = executor.backend.stream
    times = {}
    for key, graph in sorted(getattr(executor, "graphs", {}).items(), key=str):
        if key[0] != "mixed" or key[2] != seqs or not key[3]:
            continue
        start, end = cuda.event(), cuda.event()
        graph.replay()
        start.record(stream)
        for _ in range(reps):
            graph.replay()
        end.record(stream)
        end.synchronize()
        times[key[1]] = cuda.event_elapsed_time(start, end) / reps
    return times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=("standin", "cuda"), default="standin")
    p.add_argument("--config", default="llama-3.2-1b", help="cuda: the bench's --config")
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decode-ms", type=float, default=1.2, help="stand-in: GPU ms of a step")
    p.add_argument("--launch-us", type=float, default=60.0, help="stand-in: host us of a launch")
    p.add_argument("--prefill-us", type=float, default=10.0, help="stand-in: us per prompt token")
    p.add_argument("--no-phases", action="store_true", help="the bench's figures only")
    args = p.parse_args()
    for _ in range(args.repeats):
        engine = _engine(args)
        timer = PhaseTimer()
        if not args.no_phases:
            instrument(engine, timer)
        r = chat_run(engine, args.sessions, args.turns)
        print(
            f"ITL p50 {r.itl_p50_ms:.2f} p99 {r.itl_p99_ms:.2f} ms (alone p50 "
            f"{r.single_itl_p50_ms:.2f} p99 {r.single_itl_p99_ms:.2f}); decode steps p50 "
            f"{r.decode_step_p50_ms:.2f} p99 {r.decode_step_p99_ms:.2f} ms; TTFT p99 "
            f"{r.ttft_p99_ms:.1f} ms",
            flush=True,
        )
        if not args.no_phases:
            report(timer, min(2, args.sessions))
            idle = [r["idle wait"] for r in timer.records if "idle wait" in r]
            print(
                f"idle waits between steps: {len(idle)} ({1e3 * sum(idle):.1f} ms in all); "
                f"drains (serial fallbacks): {engine.num_drains}"
            )
        if args.device == "cuda":
            replay = mixed_replay_ms(engine)
            print("mixed graphs of 8 sequences, GPU ms by token bucket:", flush=True)
            print("  " + ", ".join(f"{t}: {ms:.2f}" for t, ms in replay.items()), flush=True)


if __name__ == "__main__":
    main()
