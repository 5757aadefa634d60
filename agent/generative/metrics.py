"""Metrics a generative server is judged by, on the agent's registry (vLLM's names in our
prefix): time to first token, inter-token and end-to-end latency, prompt and generated
tokens, and at scrape time the running and waiting sequences, KV-cache use and the
scheduler's deferred and cancelled counts.

As in :mod:`agent.metrics`, the hot path adds to plain numbers (:class:`Spread`,
:class:`Tally`) on the event loop's thread; families are built when scraped. There are no
preemptions to count: admission reserves each sequence's whole span (see
:mod:`agent.generative.scheduler`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from agent.metrics import LABELS, LATENCY_BUCKETS_S, Spread, Tally

if TYPE_CHECKING:
    from agent.generative.engine import Engine
    from agent.inference.stats import VersionStats

TOKEN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS_S = (*LATENCY_BUCKETS_S, 30.0, 60.0, 120.0)
RECENT_TOKENS = 8192
"""Latest first tokens and gaps kept with their times, for the fleet's windowed p99s."""
MODEL_FAILURE = "inference_failed"
"""The failure code of a sequence a model step failed (one of the model error codes)."""


class VersionSeries:
    """The series of one model version."""

    def __init__(self) -> None:
        self.ttft = Spread(E2E_BUCKETS_S)
        self.inter_token = Spread(TOKEN_BUCKETS_S)
        self.e2e = Spread(E2E_BUCKETS_S)
        self.prompt_tokens = Tally()
        self.generation_tokens = Tally()
        self.requests = Tally()
        self.errors = Tally()
        """Sequences a model step failed (not those their client cancelled)."""
        self.recent_ttft: deque[tuple[float, float]] = deque(maxlen=RECENT_TOKENS)
        """(monotonic time, seconds) of the latest first tokens."""
        self.recent_inter_token: deque[tuple[float, float]] = deque(maxlen=RECENT_TOKENS)
        """(monotonic time, seconds) of the latest gaps between tokens."""


class SequenceTimer:
    """Times one sequence from its arrival: its first token, the gaps between the next ones,
    its end; and tells the version's :class:`VersionStats` how it ended (the fleet's health
    window judges a generative version by them, as it judges a batch model's)."""

    __slots__ = ("series", "stats", "arrived", "last")

    def __init__(
        self, series: VersionSeries, stats: VersionStats, arrived: float, prompt_tokens: int
    ) -> None:
        self.series = series
        self.stats = stats
        self.arrived = arrived
        self.last: float | None = None
        series.prompt_tokens.inc(prompt_tokens)

    def token(self, now: float) -> None:
        if self.last is None:
            self.series.ttft.observe(now - self.arrived)
            self.series.recent_ttft.append((now, now - self.arrived))
        else:
            self.series.inter_token.observe(now - self.last)
            self.series.recent_inter_token.append((now, now - self.last))
        self.last = now

    def finished(self, now: float, tokens: int, failure: str | None = None) -> None:
        """The sequence ended: finished (``failure`` None), cancelled or failed (its code)."""
        self.series.e2e.observe(now - self.arrived)
        self.series.generation_tokens.inc(tokens)
        self.series.requests.inc()
        if failure is None:
            self.stats.record_success(now - self.arrived, 0.0, now - self.arrived)
            return
        if failure == MODEL_FAILURE:
            self.series.errors.inc()
        self.stats.record_failure(now - self.arrived, failure)


class GenerativeMetrics(Collector):
    """Registered on the agent's registry; ``engines`` lists what serves at scrape time."""

    def __init__(
        self,
        registry: CollectorRegistry,
        engines: Callable[[], Iterable[tuple[str, str, Engine]]],
    ) -> None:
        self._series: dict[tuple[str, str], VersionSeries] = {}
        self._engines = engines
        registry.register(self)

    def series(self, model: str, version: str) -> VersionSeries:
        return self._series.setdefault((model, version), VersionSeries())

    def all_series(self) -> list[tuple[str, int, VersionSeries]]:
        """Every version's series so far (cumulative, for the fleet's telemetry windows)."""
        return [(m, int(v), s) for (m, v), s in sorted(self._series.items())]

    def collect(self) -> Iterator[Metric]:
        yield from self._histograms()
        yield from self._counters()
        yield from self._state()

    def _histograms(self) -> Iterator[Metric]:
        for name, doc, pick in (
            ("time_to_first_token_seconds", "From arrival to the first token", "ttft"),
            (
                "inter_token_latency_seconds",
                "Between consecutive tokens of a sequence",
                "inter_token",
            ),
            ("e2e_request_latency_seconds", "From arrival to the last token", "e2e"),
        ):
            family = HistogramMetricFamily(f"edgefleet_generative_{name}", doc, labels=LABELS)
            for labels, s in self._series.items():
                spread: Spread = getattr(s, pick)
                cumulative, buckets = 0, []
                for bound, count in zip((*spread.bounds, float("inf")), spread.counts, strict=True):
                    cumulative += count
                    buckets.append((floatToGoString(bound), cumulative))  # type: ignore[no-untyped-call]
                family.add_metric(list(labels), buckets, spread.total)
            yield family

    def _counters(self) -> Iterator[Metric]:
        for name, doc, pick in (
            ("prompt_tokens", "Prompt tokens of the sequences admitted", "prompt_tokens"),
            ("generation_tokens", "Tokens generated by finished sequences", "generation_tokens"),
            ("requests", "Sequences finished or cancelled", "requests"),
        ):
            family = CounterMetricFamily(f"edgefleet_generative_{name}", doc, labels=LABELS)
            for labels, s in self._series.items():
                family.add_metric(list(labels), getattr(s, pick).value)
            yield family

    def _state(self) -> Iterator[Metric]:
        gauges = {
            "running_sequences": "Sequences holding a slot (prefilling or decoding)",
            "waiting_sequences": "Sequences waiting for a slot or KV budget",
            "kv_cache_usage_ratio": "KV-cache tokens reserved over the budget",
            "kv_cache_budget_tokens": "The KV-cache budget in tokens",
        }
        counts = {
            "deferred": "Sequences that had to wait before they ran",
            "refused": "Sequences refused: KV budget and wait queue full (429)",
            "cancelled": "Sequences cancelled before they finished (client gone)",
        }
        g = {
            k: GaugeMetricFamily(f"edgefleet_generative_{k}", d, labels=LABELS)
            for k, d in gauges.items()
        }
        c = {
            k: CounterMetricFamily(f"edgefleet_generative_sequences_{k}", d, labels=LABELS)
            for k, d in counts.items()
        }
        for model, version, engine in self._engines():
            s, labels = engine.scheduler, [model, version]
            g["running_sequences"].add_metric(labels, s.running)
            g["waiting_sequences"].add_metric(labels, s.waiting)
            g["kv_cache_usage_ratio"].add_metric(labels, s.kv_reserved_tokens / s.kv_budget_tokens)
            g["kv_cache_budget_tokens"].add_metric(labels, s.kv_budget_tokens)
            for k in counts:
                c[k].add_metric(labels, getattr(s.counts, k))
        yield from g.values()
        yield from c.values()
