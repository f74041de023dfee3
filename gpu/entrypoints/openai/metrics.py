"""GET /metrics: the server's Prometheus text, with vLLM's metric names under `tinychat:`.

Gauges of the engine's state (running and waiting requests, KV-cache use, prefix-cache hit
rate) are read from the engine's stats when scraped; counters and histograms (prompt and
generated tokens, time to first token, the gap between tokens, whole-request time) are kept by
the serving code as the tokens go out, so they measure what a client sees. The ones updated for
every event of every stream (generated tokens, the gap between tokens) are plain numbers that
the event loop adds to without a lock (`LoopCounter`, `LoopHistogram`), exported through a
collector at scrape time: prometheus_client's own take a lock and walk the buckets in Python,
~3 us an event, which at ~38k events a second is a tenth of the loop. Each server has a
registry of its own (not prometheus_client's global one), so several servers in one process —
the tests, the benchmark — never collide.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from gpu.outputs import EngineStats

PREFIX = "tinychat:"
CONTENT_TYPE = CONTENT_TYPE_LATEST
_TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120)


class ServerMetrics:
    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self.registry = CollectorRegistry()
        self._stats = stats
        reg, label = self.registry, {"model_name": model_name}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, list(label), registry=reg).labels(**label)

        def counter(name: str, doc: str) -> Counter:
            return Counter(PREFIX + name, doc, list(label), registry=reg).labels(**label)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            h = Histogram(PREFIX + name, doc, list(label), buckets=buckets, registry=reg)
            return h.labels(**label)

        self.num_requests_running = gauge("num_requests_running", "Requests in the batch.")
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests waiting to run.")
        self.kv_cache_usage = gauge("kv_cache_usage_perc", "KV-cache use (1 = full).")
        self.prefix_cache_hit_rate = gauge(
            "prefix_cache_hit_rate", "Prompt tokens found in the prefix cache, as a fraction."
        )
        self.prefix_cache_queries = gauge(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_cache_hits = gauge(
            "prefix_cache_hits", "Prompt tokens found in the prefix cache."
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens received.")
        self.generation_tokens = LoopCounter(
            PREFIX + "generation_tokens", "Tokens generated and sent.", label
        )
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds",
            "Seconds from a request's arrival to its first token.",
            _TTFT_BUCKETS,
        )
        self.inter_token_latency = LoopHistogram(
            PREFIX + "inter_token_latency_seconds",
            "Seconds between a request's tokens.",
            label,
            _ITL_BUCKETS,
        )
        reg.register(self.generation_tokens)
        reg.register(self.inter_token_latency)
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds", "Seconds from arrival to the last token.", _E2E_BUCKETS
        )
        self._success = Counter(
            PREFIX + "request_success",
            "Requests finished, by finish reason (abort: the client left or the server stopped).",
            [*label, "finished_reason"],
            registry=reg,
        )
        self._model_name = model_name

    def request_finished(self, reason: str, seconds: float) -> None:
        self._success.labels(model_name=self._model_name, finished_reason=reason).inc()
        self.e2e_request_latency.observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text, with the engine's gauges read now."""
        stats = self._stats()
        self.num_requests_running.set(stats.num_running)
        self.num_requests_waiting.set(stats.num_waiting)
        self.kv_cache_usage.set(stats.kv_usage)
        self.prefix_cache_hit_rate.set(stats.prefix_cache_hit_rate)
        self.prefix_cache_queries.set(stats.prefix_cache_queries)
        self.prefix_cache_hits.set(stats.prefix_cache_hits)
        return generate_latest(self.registry)


class LoopCounter:
    """A counter only the event loop adds to (no lock), collected at scrape time."""

    def __init__(self, name: str, doc: str, labels: dict[str, str]) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.doc, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), self.value)
        yield family


class LoopHistogram:
    """A histogram only the event loop observes into (no lock; one bisect and two adds),
    collected at scrape time with prometheus_client's cumulative buckets."""

    def __init__(
        self, name: str, doc: str, labels: dict[str, str], buckets: tuple[float, ...]
    ) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.bounds = list(buckets)
        self.counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """`count` observations of `value` (a chunk of several tokens: its mean gap each)."""
        self.counts[bisect_left(self.bounds, value)] += count
        self.sum += value * count

    def collect(self) -> Iterator[Metric]:
        cumulative, running = [], 0
        for bound, count in zip([*self.bounds, float("inf")], self.counts, strict=True):
            running += count
            cumulative.append((floatToGoString(bound), running))
        family = HistogramMetricFamily(self.name, self.doc, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), cumulative, self.sum)
        yield family
