"""The status line: the model, this tab's speed, the engine's load, and a tokens/s sparkline."""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from gpu.outputs import EngineStats, RequestMetrics

SPARK_POINTS = 40  # engine tokens/s samples shown (at the default 0.5 s: the last 20 s)


class StatusBar(Vertical):
    """Two lines: the model and this tab's last reply; the engine's load and speed.

    Updated by the chat screen (from its stats timer and on events); it never asks the engine
    anything itself."""

    def __init__(self) -> None:
        super().__init__()
        self._rates: deque[float] = deque([0.0] * SPARK_POINTS, maxlen=SPARK_POINTS)

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Static("loading model…", id="status-model", markup=False)
            yield Static("", id="status-tab", markup=False)
        with Horizontal():
            yield Static("", id="status-engine", markup=False)
            yield Sparkline(list(self._rates), id="status-spark")
            yield Static("", id="status-rate", markup=False)

    def show_model(self, text: str, *, failed: bool = False) -> None:
        model = self.query_one("#status-model", Static)
        model.update(text)
        model.set_class(failed, "error")

    def show_tab(self, metrics: RequestMetrics | None) -> None:
        """This tab's last reply: decode speed and time to first token."""
        parts = []
        if metrics is not None:
            if (ttft := metrics.time_to_first_token) is not None:
                parts.append(f"TTFT {ttft * 1000:.0f} ms")
            if (rate := metrics.tokens_per_s) is not None:
                parts.append(f"{rate:.1f} tok/s")
        text = f"this tab: {' · '.join(parts)}" if parts else ""
        self.query_one("#status-tab", Static).update(text)

    def show_engine(self, stats: EngineStats | None, *, sample: bool = False) -> None:
        """The engine's running/waiting sequences, KV use and prefix-cache hit rate; with
        `sample`, also a new sparkline point (taken at a steady pace by the caller)."""
        engine = self.query_one("#status-engine", Static)
        rate = self.query_one("#status-rate", Static)
        if stats is None:
            engine.update("")
            rate.update("")
            return
        engine.update(
            f"engine: {stats.num_running} running · {stats.num_waiting} waiting · "
            f"KV {_percent(stats.kv_usage)} used · "
            f"prefix cache hits {_percent(stats.prefix_cache_hit_rate)}"
        )
        rate.update(f"{stats.tokens_per_s:.0f} tok/s")
        if sample:
            self._rates.append(stats.tokens_per_s)
            self.query_one(Sparkline).data = list(self._rates)


def _percent(fraction: float) -> str:
    """A share, with a decimal while it is small (a long chat is 1% of a large KV cache)."""
    return f"{fraction:.1%}" if 0 < fraction < 0.1 else f"{fraction:.0%}"
