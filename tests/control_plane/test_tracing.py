"""The control plane's API calls as OpenTelemetry server spans, read off a real OTLP/HTTP
receiver: in the caller's trace, named by their route template."""

from __future__ import annotations

import pytest

from tests.control_plane.conftest import ControlPlaneFactory
from tests.otlp import Receiver, client_span


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_api_call_is_a_span_in_the_caller_s_trace_named_by_its_route(
    start_control_plane: ControlPlaneFactory, receiver: tuple[Receiver, str]
) -> None:
    found, endpoint = receiver
    app_span, headers, provider = client_span()
    ctx = app_span.get_span_context()
    with start_control_plane(tracing={"enabled": True, "endpoint": endpoint}) as cp:
        assert cp.admin.get("/api/v1/devices", headers=headers).status_code == 200
        missing = cp.admin.get("/api/v1/devices/nope", headers=headers)
        assert missing.status_code == 404
    app_span.end()
    provider.shutdown()
    (listed,) = found.named("GET /api/v1/devices")
    (one,) = found.named("GET /api/v1/devices/{device_id}")
    for span in (listed, one):
        assert (span.trace_id, span.parent_span_id) == (
            f"{ctx.trace_id:032x}",
            f"{ctx.span_id:016x}",
        )
        assert span.attributes["resource:service.name"] == "edgefleet-control-plane"
    assert listed.attributes["http.response.status_code"] == 200
    assert one.attributes["http.response.status_code"] == 404
    assert one.attributes["url.path"] == "/api/v1/devices/nope"
