"""The OpenAI-compatible front end's requests are traced like REST's: a server span in the
caller's trace, read off a real OTLP/HTTP receiver."""

from __future__ import annotations

from pathlib import Path

from tests.agent.openai.conftest import MODEL
from tests.agent.server import serve
from tests.otlp import Receiver, client_span


def test_a_completion_is_a_span_in_the_caller_s_trace(
    lm_repository: Path,
    receiver: tuple[Receiver, str],
) -> None:
    found, endpoint = receiver
    app_span, headers, provider = client_span()
    ctx = app_span.get_span_context()
    with serve(lm_repository, tracing={"enabled": True, "endpoint": endpoint}) as agent:
        body = {"model": MODEL, "prompt": "edge", "max_tokens": 4, "stream": True}
        answer = agent.client.post("/v1/completions", json=body, headers=headers)
        assert answer.status_code == 200 and answer.text.rstrip().endswith("data: [DONE]")
    app_span.end()
    provider.shutdown()
    (span,) = found.named("POST /v1/completions")
    assert (span.trace_id, span.parent_span_id) == (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert span.attributes["http.response.status_code"] == 200
    # the stream's whole life: the span ends once the last event is written
    assert span.end_ns > span.start_ns
