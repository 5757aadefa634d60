"""Property tests over the wire of a real agent: any value of the headers the routes read and any
version segment in a path is answered with a 4xx, never a 5xx (e.g. '²', which str.isdigit()
accepts and int() refuses)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.agent.server import RunningAgent, copy_models, serve
from tests.hardening.rawhttp import head, request

LATIN1 = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=12)
WIRE = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
BODY = (
    b'{"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": '
    + b"["
    + b",".join([b"0"] * 256)
    + b"]}]}"
)


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = copy_models(example_repo, tmp_path_factory.mktemp("repo"), "mlp")
    with serve(repo) as running:
        yield running


def client_error(resp: httpx.Response) -> bool:
    return 200 <= resp.status_code < 500


@WIRE
@given(value=LATIN1 | st.sampled_from(["\u00b2", "\u00b9\u00b3", " 12 ", "-1", "1e3", ""]))
def test_inference_header_content_length_any_value(agent: RunningAgent, value: str) -> None:
    # by hand: httpx refuses to send some of these values, a hostile client would not
    headers = {"Inference-Header-Content-Length": value, "Content-Length": str(len(BODY))}
    resp = request(agent.url, head("POST", "/v2/models/mlp/infer", headers) + BODY)
    assert 200 <= resp.status < 500, (value, resp.status, resp.body)


@settings(WIRE, max_examples=60)
@given(
    version=st.text(min_size=1, max_size=10).filter(lambda v: v not in (".", ".."))
    | st.sampled_from(["\u00b2", "\u0661", "1\u00b2", "01", "99999999999999999999999"])
)
def test_any_version_segment(agent: RunningAgent, version: str) -> None:
    for path in (
        "/v2/models/mlp/versions/{}",
        "/v2/models/mlp/versions/{}/ready",
        "/v1/models/mlp/versions/{}/metadata",
    ):
        url = path.format(quote(version, safe=""))
        resp = agent.client.get(url)
        assert client_error(resp), (version, url, resp.status_code, resp.text)
    resp = agent.client.post(
        f"/v2/models/mlp/versions/{quote(version, safe='')}/infer", content=BODY
    )
    assert client_error(resp), (version, resp.status_code, resp.text)
