"""The status line: the model, this tab's speed, the engine's load, and a tokens/s sparkline.

Each line is made of whole fields ("KV 0% used", "12 tok/s"). When the terminal is too narrow
for all of them, the least important fields are left out whole, never cut mid-word: at 80
columns the bar still reads "20.0 tok/s", not "20.0 tok/".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from gpu.outputs import EngineStats, RequestMetrics

SPARK_POINTS = 40  # engine tokens/s samples shown (at the default 0.5 s: the last 20 s)
SPARK_MIN_WIDTH = 4
SEPARATOR = " · "
GAP = 2  # columns between two groups on a line (their margin in tinychat.tcss)


@dataclass(frozen=True, eq=False)
class Field:
    """One piece of a status line. `rank` 0 is the last to go when the line is too narrow.
    (Compared by identity: two fields with the same text are still two fields.)"""

    text: str
    rank: int


@dataclass(frozen=True)
class Group:
    """Fields shown together in one widget, joined by " · ", after an optional prefix."""

    fields: tuple[Field, ...]
    prefix: str = ""

    def text(self, kept: set[Field]) -> str:
        shown = [f.text for f in self.fields if f in kept]
        return self.prefix + SEPARATOR.join(shown) if shown else ""


def fit_groups(groups: Sequence[Group], width: int, gap: int = GAP) -> list[str]:
    """Each group's text, with the highest-ranked fields left out until the line fits in
    `width` (groups that show something are `gap` apart). A single field wider than the
    whole line is cut with "…", the only cut ever made."""
    kept = {f for g in groups for f in g.fields}

    def line_width() -> int:
        texts = [t for g in groups if (t := g.text(kept))]
        return sum(cell_len(t) for t in texts) + gap * max(0, len(texts) - 1)

    for field in sorted(kept, key=lambda f: f.rank, reverse=True):
        if line_width() <= width or len(kept) == 1:
            break
        kept.discard(field)
    texts = [g.text(kept) for g in groups]
    if line_width() > width:  # one field alone is too wide
        texts = [_cut(t, width) if t else t for t in texts]
    return texts


def _cut(text: str, width: int) -> str:
    if cell_len(text) <= width:
        return text
    while text and cell_len(text) + 1 > width:
        text = text[:-1]
    return text + "…" if width > 0 else ""


class StatusBar(Vertical):
    """Two lines: the model and this tab's last reply; the engine's load and speed.

    Updated by the chat screen (from its stats timer and on events); it never asks the engine
    anything itself. The fields are kept and laid out again whenever the bar is resized."""

    def __init__(self) -> None:
        super().__init__()
        self._rates: deque[float] = deque([0.0] * SPARK_POINTS, maxlen=SPARK_POINTS)
        self._model: tuple[Field, ...] = (Field("loading model…", 1),)
        self._tab: tuple[Field, ...] = ()
        self._engine: tuple[Field, ...] = ()
        self._rate: tuple[Field, ...] = ()

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Static("loading model…", id="status-model", markup=False)
            yield Static("", id="status-tab", markup=False)
        with Horizontal():
            yield Static("", id="status-engine", markup=False)
            yield Sparkline(list(self._rates), id="status-spark")
            yield Static("", id="status-rate", markup=False)

    def on_resize(self, _: events.Resize) -> None:
        self._layout()

    def show_model(self, text: str, *, failed: bool = False) -> None:
        """The engine's description: " · "-separated fields, the most important first."""
        parts = text.split(SEPARATOR)
        # The model's name goes last of all; its details (device, KV size) before the tab's.
        self._model = tuple(Field(p, 1 if i == 0 else 3 + i) for i, p in enumerate(parts))
        self.query_one("#status-model", Static).set_class(failed, "error")
        self._layout()

    def show_tab(self, metrics: RequestMetrics | None, *, rereading: int | None = None) -> None:
        """This tab's last reply (decode speed and time to first token), or, while a
        restored chat's history is prefilled again before its first token, that."""
        fields = []
        if rereading is not None:
            fields.append(Field(f"re-reading the chat: {rereading:,} tokens…", 0))
        elif metrics is not None:
            if (rate := metrics.tokens_per_s) is not None:
                fields.append(Field(f"{rate:.1f} tok/s", 2))
            if (ttft := metrics.time_to_first_token) is not None:
                fields.insert(0, Field(f"TTFT {ttft * 1000:.0f} ms", 3))
        self._tab = tuple(fields)
        self._layout()

    def show_engine(self, stats: EngineStats | None, *, sample: bool = False) -> None:
        """The engine's running/waiting sequences, KV use and prefix-cache hit rate; with
        `sample`, also a new sparkline point (taken at a steady pace by the caller)."""
        if stats is None:
            self._engine = self._rate = ()
        else:
            self._engine = (
                Field(f"{stats.num_running} running", 1),
                Field(f"{stats.num_waiting} waiting", 3),
                Field(f"KV {_percent(stats.kv_usage)} used", 4),
                Field(f"prefix cache hits {_percent(stats.prefix_cache_hit_rate)}", 5),
            )
            self._rate = (Field(f"{stats.tokens_per_s:.0f} tok/s", 0),)
        if sample and stats is not None:
            self._rates.append(stats.tokens_per_s)
            self.query_one(Sparkline).data = list(self._rates)
        self._layout()

    def _layout(self) -> None:
        """Fit both lines to the bar's width (before the first layout: to no width at all,
        which shows the most important field alone until the resize that follows)."""
        width = self.content_size.width
        model, tab = fit_groups([Group(self._model), Group(self._tab, "this tab: ")], width)
        # The sparkline is a field too: it goes before the engine's details, after its count.
        spark = Field(" " * SPARK_MIN_WIDTH, 2)
        engine, spark_text, rate = fit_groups(
            [
                Group(self._engine, "engine: "),
                Group((spark,) if self._rate else ()),
                Group(self._rate),
            ],
            width,
        )
        for name, text in (("model", model), ("tab", tab), ("engine", engine), ("rate", rate)):
            static = self.query_one(f"#status-{name}", Static)
            if str(static.content) != text:  # the stats timer mostly finds nothing new
                static.update(text)
            static.display = bool(text)  # an empty one would still take its margin
        self.query_one("#status-spark", Sparkline).display = bool(spark_text)


def _percent(fraction: float) -> str:
    """A share, with a decimal while it is small (a long chat is 1% of a large KV cache)."""
    return f"{fraction:.1%}" if 0 < fraction < 0.1 else f"{fraction:.0%}"
