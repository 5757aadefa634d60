"""The V2 infer fast path recognises exactly the two infer routes; everything else goes through
the router as before (a real agent answers both ways the same)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.api.fastpath import infer_route
from agent.http.answers import respond
from agent.http.connection import CYCLE_KEY
from tests.agent.server import copy_models, serve
from tests.hardening.rawhttp import closed_by_peer, connect, head, read_response

INFER = "/v2/models/mlp/infer"


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/v2/models/mlp/infer", ("mlp", None)),
        ("/v2/models/mlp/versions/3/infer", ("mlp", "3")),
        ("/v2/models//infer", None),
        ("/v2/models/mlp/versions//infer", None),
        ("/v2/models/mlp/ready", None),
        ("/v2/models/mlp/infer/", None),
        ("/v2/models/a/b/infer", None),
        ("/v1/models/mlp/infer", None),
        ("/v2/models/mlp/versions/3/extra/infer", None),
    ],
)
def test_infer_route(path: str, route: tuple[str, str | None] | None) -> None:
    assert infer_route(path) == route


def test_fast_path_and_router_agree(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    body = {
        "inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": [0.5] * 256}]
    }
    with serve(repo) as agent:
        c = agent.client
        latest = c.post("/v2/models/mlp/infer", json=body)
        pinned = c.post("/v2/models/mlp/versions/1/infer", json=body)
        assert latest.status_code == pinned.status_code == 200
        assert latest.json()["outputs"] == pinned.json()["outputs"]
        assert latest.headers["x-request-id"] and "traceparent" in latest.headers
        missing = c.post("/v2/models/nope/infer", json=body)
        assert missing.status_code == 404 and "nope" in missing.json()["error"]
        assert c.get("/v2/models/mlp/infer").status_code == 405  # not POST: the router answers
        bad = c.post("/v2/models/mlp/infer", content=b"{")
        assert bad.status_code == 400


def test_a_response_written_directly_keeps_http_semantics(
    example_repo: Path, tmp_path: Path
) -> None:
    """The fast path writes its response on the connection itself (agent.http.answers.respond):
    the head carries what uvicorn's send would write, the connection stays open for the next
    request, and a request asking to close gets ``connection: close`` and a closed socket."""
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": [0.5] * 256}]}
    ).encode()
    with serve(repo) as agent, connect(agent.url) as sock:
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        first_id = "first-request"
        sock.sendall(head("POST", INFER, {**headers, "X-Request-Id": first_id}) + body)
        first = read_response(sock)
        assert first.status == 200
        assert len(first.body) == int(first.headers["content-length"])
        assert first.json()["outputs"][0]["shape"] == [1, 10]
        assert first.headers["content-type"] == "application/json"
        assert first.headers["x-request-id"] == first_id and "date" in first.headers
        assert first.headers["server-timing"].startswith("queue;dur=")
        assert "connection" not in first.headers
        sock.sendall(head("POST", INFER, {**headers, "Connection": "close"}) + body)
        last = read_response(sock)
        assert last.status == 200 and last.headers["connection"] == "close"
        assert last.json()["outputs"] == first.json()["outputs"]
        assert closed_by_peer(sock)


def test_respond_leaves_to_asgi_what_it_cannot_write_itself() -> None:
    # Under another ASGI server there is no cycle of ours: the caller sends ASGI messages.
    assert respond({"type": "http"}, 200, [], b"") is False
    # A client that reads nothing of what it was sent: uvicorn's send waits for the drain.
    cycle = SimpleNamespace(response_started=False, flow=SimpleNamespace(write_paused=True))
    assert respond({CYCLE_KEY: cycle}, 200, [], b"") is False
    assert cycle.response_started is False
