"""A real HTTP server taking POSTs on 127.0.0.1; on it, an OTLP/HTTP traces receiver (protobuf bodies on /v1/traces, as a
collector serves them) and an app's own span, for the tests of what the agent and the control
plane export."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


@dataclass
class Received:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    start_ns: int
    end_ns: int


@dataclass
class Receiver:
    """OTLP/HTTP's traces endpoint, as a collector serves it: protobuf bodies on /v1/traces."""

    spans: list[Received] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def record(self, path: str, body: bytes) -> None:
        self.paths.append(path)
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: _value(a.value) for a in span.attributes}
                    attributes |= {
                        f"resource:{a.key}": _value(a.value) for a in resource.resource.attributes
                    }
                    self.spans.append(
                        Received(
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            attributes,
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                        )
                    )

    def named(self, name: str) -> list[Received]:
        return [s for s in self.spans if s.name == name]

    def children(self, parent: Received) -> dict[str, Received]:
        return {s.name: s for s in self.spans if s.parent_span_id == parent.span_id}


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value"))


@contextmanager
def posts_to(record: Callable[[str, bytes], None], status: int = 200) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 that hands every POST's path and body to ``record``
    and answers ``status`` with no body; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            record(self.path, self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    found = Receiver()
    with posts_to(found.record) as url:
        yield found, f"{url}/v1/traces"


def client_span() -> tuple[Any, dict[str, str], TracerProvider]:
    """A span of the app's own, and the headers that carry it (W3C traceparent)."""
    provider = TracerProvider()
    span = provider.get_tracer("app").start_span("app: classify frame")
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
    return span, carrier, provider
