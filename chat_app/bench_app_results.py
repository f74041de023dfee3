"""What one `tinychat bench app` run measured, and the table it prints.

`Arrivals` takes each tab's token arrivals (time, count) from whichever thread delivers them;
`RunResult` is what a run reports from them (see chat_app/bench_app.py for what each figure
means and why the stream's rate, not the wall time, is the ratio's basis).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class RunResult:
    """One run: the whole stream's rate, and how evenly tokens reached the tabs."""

    run: str
    tabs: int
    tokens: int  # received, over every tab
    tokens_requested: int
    chars: int  # of text received: what the app had to render
    wall_s: float  # first request queued -> last token received
    tok_s: float  # tokens / wall_s: prompts, first tokens and the stream
    # The stream's rate: the tokens that arrived after the first arrival (of any tab), over
    # the time from it to the last. Tokens a frame coalesced arrive with the frame that ends
    # their interval, so this counts them in the time that made them: no app is charged
    # for a frame of lag at either end, however short the run.
    stream_tok_s: float
    gap_p50_ms: float
    gap_p99_ms: float
    gap_max_ms: float
    tokens_per_arrival: float  # > 1 where a frame coalesces tokens
    ttft_p50_ms: float
    # CPU seconds this process used per second of the run (all its threads): with no app,
    # the engine thread's or the core client's; with the app, the UI's on top.
    process_cpu: float = 0.0
    # The same CPU seconds per 1,000 tokens received: what the app costs a token, whatever
    # else the machine runs (a busy machine stretches the wall time, not this).
    cpu_ms_per_1k_tokens: float = 0.0
    x_engine: float | None = None


class Arrivals:
    """Token arrivals at each tab's sink: (time, tokens) per request, safe from any thread
    (one list per request, appended by the one thread that delivers it)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.start = 0.0
        self._cpu_start = 0.0
        self._by_tab: dict[str, list[tuple[float, int]]] = {}
        self.chars = 0

    def begin(self) -> None:
        self.start = self.clock()
        self._cpu_start = time.process_time()

    def record(self, tab: str, num_tokens: int, text: str) -> None:
        self.chars += len(text)
        if num_tokens:
            self._by_tab.setdefault(tab, []).append((self.clock(), num_tokens))

    def result(self, run: str, tabs: int, requested: int) -> RunResult:
        cpu = time.process_time() - self._cpu_start
        tokens = sum(n for arrivals in self._by_tab.values() for _, n in arrivals)
        ends = [arrivals[-1][0] for arrivals in self._by_tab.values()]
        wall = max(ends) - self.start if ends else 0.0
        gaps = [
            b[0] - a[0]
            for arrivals in self._by_tab.values()
            for a, b in zip(arrivals, arrivals[1:], strict=False)
        ]
        firsts = [arrivals[0][0] - self.start for arrivals in self._by_tab.values()]
        first = self.start + min(firsts, default=0.0)
        after_first = sum(n for a in self._by_tab.values() for t, n in a if t > first)
        stream_s = wall - min(firsts, default=0.0)
        count = sum(len(arrivals) for arrivals in self._by_tab.values())
        return RunResult(
            run=run,
            tabs=tabs,
            tokens=tokens,
            tokens_requested=requested,
            chars=self.chars,
            wall_s=wall,
            tok_s=tokens / wall if wall > 0 else 0.0,
            stream_tok_s=after_first / stream_s if stream_s > 0 else 0.0,
            gap_p50_ms=1e3 * percentile(gaps, 50),
            gap_p99_ms=1e3 * percentile(gaps, 99),
            gap_max_ms=1e3 * max(gaps, default=0.0),
            tokens_per_arrival=tokens / count if count else 0.0,
            ttft_p50_ms=1e3 * percentile(firsts, 50),
            process_cpu=cpu / wall if wall > 0 else 0.0,
            cpu_ms_per_1k_tokens=1e6 * cpu / tokens if tokens else 0.0,
        )


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def add_ratios(results: list[RunResult]) -> None:
    by_run = {r.run: r for r in results}
    reference = by_run.get("engine") or by_run.get("core") or by_run.get("synthetic")
    for r in results:
        if reference is not None and reference.stream_tok_s > 0:
            r.x_engine = r.stream_tok_s / reference.stream_tok_s


def print_report(report: dict[str, Any]) -> None:
    print(
        f"\nbench app: {report['model']} ({report['device']}), {report['tabs']} tab(s) x "
        f"{report['new_tokens']} new tokens, {report['sampling']}, headless "
        f"{report['size'][0]}x{report['size'][1]}"
    )
    print(
        f"{'run':<10}{'tok/s':>9}{'stream':>9}{'x engine':>10}{'gap p50 ms':>12}{'gap p99 ms':>12}"
        f"{'gap max ms':>12}{'tok/arrival':>13}{'TTFT ms':>9}{'CPU':>6}{'CPU ms/1k tok':>15}"
    )
    for r in report["runs"]:
        ratio = f"{r['x_engine']:.2f}x" if r["x_engine"] is not None else ""
        print(
            f"{r['run']:<10}{r['tok_s']:>9.1f}{r['stream_tok_s']:>9.1f}{ratio:>10}{r['gap_p50_ms']:>12.2f}"
            f"{r['gap_p99_ms']:>12.2f}{r['gap_max_ms']:>12.1f}{r['tokens_per_arrival']:>13.2f}"
            f"{r['ttft_p50_ms']:>9.1f}{r['process_cpu']:>6.2f}"
            f"{r.get('cpu_ms_per_1k_tokens', 0.0):>15.1f}"
        )
    short = [r["run"] for r in report["runs"] if r["tokens"] != r["tokens_requested"]]
    if short:
        print(f"  (fewer tokens than requested in: {', '.join(short)})")
