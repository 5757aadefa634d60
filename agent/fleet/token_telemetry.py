"""The telemetry windows of generative versions: sequences, failures, tokens in and out, and
the p99 time to first token and between tokens over the window.

Read from each version's series (:class:`agent.generative.metrics.VersionSeries`), which are
cumulative and kept per (model, version) for the agent's life: a window's counts are the
difference from the last reading, and its latencies are those recorded in it, by time, so no
sequence or token gap is counted in two windows or in none. A version that left service is
reported while it still counts (its streams in flight finish on it), then no more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from agent.inference.stats import percentiles_of
from common.protocol.messages import GenerativeTelemetry, ModelTelemetry

if TYPE_CHECKING:
    from agent.generative.metrics import VersionSeries
    from agent.generative.models import GenerativeModels

Counts = tuple[int, int, int, int]
"""Sequences ended, failed by the model, prompt tokens, generated tokens."""


def _counts(s: VersionSeries) -> Counts:
    values = (s.requests, s.errors, s.prompt_tokens, s.generation_tokens)
    return tuple(int(v.value) for v in values)  # type: ignore[return-value]


class TokenWindows:
    """Cuts the generative versions' series into telemetry windows."""

    def __init__(
        self, models: Callable[[], GenerativeModels | None], hourly_cost: float | None = None
    ) -> None:
        self.models = models
        """The generative models, or None while there are none."""
        self.hourly_cost = hourly_cost
        """The device's cost per hour (``device_hourly_cost``), for the cost per 1k tokens."""
        self._last: dict[tuple[str, int], Counts] = {}

    def collect(self, since: float, now: float) -> list[ModelTelemetry]:
        """The windows of ``[since, now)`` (monotonic seconds), one per version."""
        models = self.models()
        if models is None:
            return []
        serving = {(name, gv.version) for name, gv in models.served.items()}
        out = []
        for model, version, series in models.metrics.all_series():
            current = _counts(series)
            last = self._last.get((model, version), (0, 0, 0, 0))
            self._last[(model, version)] = current
            requests, errors, prompt, generated = (
                a - b for a, b in zip(current, last, strict=True)
            )
            ttft = [v for t, v in series.recent_ttft if since <= t < now]
            gaps = [v for t, v in series.recent_inter_token if since <= t < now]
            if (model, version) not in serving and not (requests or ttft or gaps):
                continue  # out of service and idle: nothing to say
            cost = None
            if self.hourly_cost is not None and generated > 0:
                cost = self.hourly_cost * (now - since) / 3600 / generated * 1000
            ttft_p99 = percentiles_of(ttft, (99,))
            gap_p99 = percentiles_of(gaps, (99,))
            out.append(
                ModelTelemetry(
                    model=model,
                    version=version,
                    requests=requests,
                    errors=errors,
                    rows=requests,
                    batches=0,
                    generative=GenerativeTelemetry(
                        prompt_tokens=prompt,
                        generated_tokens=generated,
                        ttft_p99_ms=ttft_p99[0] * 1000 if ttft_p99 else None,
                        inter_token_p99_ms=gap_p99[0] * 1000 if gap_p99 else None,
                        cost_per_1k_tokens=cost,
                    ),
                )
            )
        return out
