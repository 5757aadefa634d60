"""OpenTelemetry traces of requests: a server span per REST or gRPC request, continuing the
caller's W3C ``traceparent``, with ``queue`` and ``compute`` children laid out from the times
the batcher measured, exported over OTLP/HTTP by the SDK's batch processor (never on the
request's path: a span is queued in memory, at most 2,048, and dropped beyond that).

Only :mod:`agent.main` constructs :class:`Tracing`, and only when ``[tracing] enabled``: with
tracing off the SDK is never imported and the front ends test one ``None`` per request.

Attributes follow OpenTelemetry's HTTP and RPC semantic conventions (``http.request.method``,
``url.path``, ``http.response.status_code``; ``rpc.system``, ``rpc.service``, ``rpc.method``,
``rpc.grpc.status_code``) and add the agent's: ``edgefleet.model``, ``edgefleet.model.version``,
``edgefleet.runtime``, ``edgefleet.execution_provider``, ``edgefleet.request_id`` and, on the
compute child, ``edgefleet.batch.rows`` (the rows of the batch the request ran in); V2 REST
requests also have ``decode`` and ``encode`` children. A
pipeline's request has a ``step <name>`` child per step instead (``edgefleet.pipeline.step``).
NOTE: https://opentelemetry.io/docs/specs/semconv/http/http-spans/
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from common.tracing import TracingSettings, tracer_provider
from runtimes.base import Placement


class SpanTiming(NamedTuple):
    """What a front end measured of an answered request, for its span's children."""

    queue_s: float
    compute_s: float
    answered: float
    """Monotonic time the response was ready (after ``encode_s``)."""
    rows: int
    """Rows of the batch the request ran in."""
    steps: tuple[tuple[str, float], ...] = ()
    """A pipeline's (step, seconds), in order: its children instead of queue and compute."""
    decode_s: float = 0.0
    """Decoding the request's body (0: not measured apart)."""
    encode_s: float = 0.0
    """Encoding the response (0: not measured apart)."""


class Tracing:
    """The tracer provider, its OTLP exporter and sampler, built from the settings (and,
    for what they leave unset, the SDK's OTEL_* variables)."""

    def __init__(self, settings: TracingSettings) -> None:
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = tracer_provider(settings, "edgefleet-agent")
        self.tracer = self.provider.get_tracer("edgefleet.agent")
        self._server = SpanKind.SERVER
        self._propagator = TraceContextTextMapPropagator()

    def start(self, name: str, traceparent: str | None, attributes: dict[str, Any]) -> RequestSpan:
        """A server span from now, the child of ``traceparent`` when the caller sent one."""
        parent = self._propagator.extract({"traceparent": traceparent}) if traceparent else None
        started_ns = time.time_ns()
        span = self.tracer.start_span(
            name, context=parent, kind=self._server, start_time=started_ns, attributes=attributes
        )
        return RequestSpan(self, span, time.monotonic(), started_ns)

    def shutdown(self) -> None:
        """Export what is queued (bounded by the SDK's export timeout), then stop."""
        self.provider.shutdown()


class RequestSpan:
    """One request's server span; its children are written when it ends, from monotonic
    times converted to the span's wall clock."""

    __slots__ = ("_tracing", "span", "_mono", "_ns")

    def __init__(self, tracing: Tracing, span: Any, mono: float, started_ns: int) -> None:
        self._tracing, self.span, self._mono, self._ns = tracing, span, mono, started_ns

    @property
    def traceparent(self) -> str:
        """The W3C header naming this span, for the response."""
        ctx = self.span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    @property
    def trace_id(self) -> str:
        return f"{self.span.get_span_context().trace_id:032x}"

    def _wall_ns(self, mono: float) -> int:
        return self._ns + int((mono - self._mono) * 1e9)

    def served(
        self, model: str, version: str, placement: Placement | None, timing: SpanTiming | None
    ) -> None:
        """What the request ran on, and its children from ``timing``: ``decode``, ``queue``,
        ``compute`` and ``encode``, or a pipeline's ``step <name>`` spans."""
        span = self.span
        if not span.is_recording():
            return
        span.set_attribute("edgefleet.model", model)
        span.set_attribute("edgefleet.model.version", version)
        if placement is not None:
            span.set_attribute("edgefleet.runtime", str(placement.runtime))
            span.set_attribute("edgefleet.execution_provider", ",".join(placement.providers))
        if timing is None:
            return
        from opentelemetry.trace import set_span_in_context

        parent = set_span_in_context(span)
        if timing.steps:
            self._steps(parent, timing.steps, timing.answered - timing.encode_s)
            return
        # boundaries, so that each child ends exactly where the next begins
        computed = timing.answered - timing.encode_s
        queued = computed - timing.compute_s
        arrived = queued - timing.queue_s
        laid = [
            ("decode", arrived - timing.decode_s, arrived, {}),
            ("queue", arrived, queued, {}),
            ("compute", queued, computed, {"edgefleet.batch.rows": timing.rows}),
            ("encode", computed, timing.answered, {}),
        ]
        for name, start, end, attributes in laid:
            if end <= start and name in ("decode", "encode"):
                continue  # not measured apart by this front end
            child = self._tracing.tracer.start_span(
                name, context=parent, start_time=self._wall_ns(start), attributes=attributes
            )
            child.end(end_time=self._wall_ns(end))

    def _steps(self, parent: Any, steps: tuple[tuple[str, float], ...], answered: float) -> None:
        """A pipeline's steps as children, one after the other, the last ending at the answer
        (its model steps' queue and compute lie within their step's time)."""
        tracer = self._tracing.tracer
        at = answered - sum(seconds for _, seconds in steps)
        for name, seconds in steps:
            step = tracer.start_span(
                f"step {name}",
                context=parent,
                start_time=self._wall_ns(at),
                attributes={"edgefleet.pipeline.step": name},
            )
            at += seconds  # the next step starts at this very value: no rounding between
            step.end(end_time=self._wall_ns(at))

    def end(self, attributes: dict[str, Any], error: str | None = None) -> None:
        span = self.span
        if span.is_recording():
            span.set_attributes(attributes)
            if error is not None:
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR, error))
        span.end()
