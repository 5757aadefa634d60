"""Every way the agent turns a request away is counted, once, in one metric:
``edgefleet_requests_refused_total{reason}``. Each case provokes one refusal of a real agent on
127.0.0.1 (over raw sockets where a client library would not send the request) and reads
``/metrics`` before and after: that reason, and only it, went up by exactly 1.

``/metrics`` is served without a key and outside the request limits here
(``api_key_open_paths``), so that reading it is never a refusal itself.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import RefusalReason
from tests.agent.fakes import Gate, gated_factory
from tests.agent.server import RunningAgent, copy_models, serve, wait_until
from tests.hardening.rawhttp import RawResponse, closed_by_peer, connect, head, read_response

INFER = "/v2/models/mlp/infer"
OPEN_PATHS = ("/v2/health/live", "/v2/health/ready", "/metrics")
MiB = 2**20
LIMITS = dict(
    max_header_bytes=8192,
    header_timeout_s=0.5,
    body_timeout_s=1.0,
    max_request_bytes=4 * MiB,
    max_inflight_body_bytes=2 * MiB,
    api_key_open_paths=OPEN_PATHS,
)
KEY = "refusals-test-key"
ROW = [0.0] * 256


def v2(data: list[object], datatype: str = "FP32") -> dict[str, object]:
    return {"inputs": [{"name": "input", "shape": [1, 256], "datatype": datatype, "data": data}]}


def refusals(url: str) -> dict[str, float]:
    """``edgefleet_requests_refused_total`` by reason, as ``/metrics`` exposes it."""
    text = httpx.get(url + "/metrics").text
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name == "edgefleet_requests_refused":
            for sample in family.samples:
                found[sample.labels["reason"]] = sample.value
    return found


@contextmanager
def refused_once(agent: RunningAgent, reason: RefusalReason) -> Iterator[None]:
    before = refusals(agent.url)
    yield
    after = refusals(agent.url)
    changed = {r: after[r] - before.get(r, 0) for r in after if after[r] != before.get(r, 0)}
    assert changed == {reason.value: 1}, changed


@pytest.fixture(scope="module")
def gate() -> Gate:
    return Gate(closed=False)


@pytest.fixture(scope="module")
def agent(
    example_repo: Path, tmp_path_factory: pytest.TempPathFactory, gate: Gate
) -> Iterator[RunningAgent]:
    queue = "instances = 1\n[batching]\nmax_batch_size = 1\nmax_queue_size = 1\n"
    repo = copy_models(
        example_repo, tmp_path_factory.mktemp("refusals"), "mlp", configs={"mlp": queue}
    )
    copy_models(example_repo, repo / "broken-src", "mlp")
    (repo / "broken-src" / "mlp").rename(repo / "broken")
    (repo / "broken-src").rmdir()
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not a model")  # fails its load
    with serve(repo, runtime_factory=gated_factory(gate), **LIMITS) as running:  # type: ignore[arg-type]
        yield running


@pytest.fixture(scope="module")
def keyed(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = copy_models(example_repo, tmp_path_factory.mktemp("keyed"), "mlp")
    with serve(
        repo,
        api_key=KEY,
        rate_limit_per_s=0.01,  # no token comes back within the test
        rate_limit_burst=2,
        api_key_open_paths=OPEN_PATHS,
    ) as running:
        yield running


def raw(agent: RunningAgent, data: bytes) -> RawResponse:
    with connect(agent.url) as sock:
        sock.sendall(data)
        return read_response(sock)


def post(path: str, body: bytes, **headers: str) -> bytes:
    return head("POST", path, {"Content-Length": str(len(body)), **headers}) + body


def test_every_reason_is_exposed_from_the_start(agent: RunningAgent) -> None:
    assert set(refusals(agent.url)) == {r.value for r in RefusalReason}


def test_a_request_served_is_no_refusal(agent: RunningAgent) -> None:
    before = refusals(agent.url)
    assert agent.infer_json("mlp", [ROW]).status_code == 200
    assert agent.client.get("/v2/models/mlp").status_code == 200
    assert refusals(agent.url) == before


# -- the HTTP protocol ------------------------------------------------------------------------

GARBAGE = b"NOT HTTP AT ALL\r\n\r\n"
UPGRADE = head("GET", "/v2", {"Connection": "Upgrade", "Upgrade": "websocket"})


@pytest.mark.parametrize("data", [GARBAGE, UPGRADE], ids=["unparsable", "upgrade"])
def test_bad_http(agent: RunningAgent, data: bytes) -> None:
    with refused_once(agent, RefusalReason.BAD_HTTP):
        assert raw(agent, data).status == 400


def test_max_header_bytes(agent: RunningAgent) -> None:
    many = {f"X-Filler-{i}": "x" * 100 for i in range(100)}
    with refused_once(agent, RefusalReason.MAX_HEADER_BYTES):
        assert raw(agent, head("GET", "/v2", many)).status == 431


def test_header_timeout(agent: RunningAgent) -> None:
    with refused_once(agent, RefusalReason.HEADER_TIMEOUT):
        assert raw(agent, b"GET /v2 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").status == 408


def test_body_timeout(agent: RunningAgent) -> None:
    with refused_once(agent, RefusalReason.BODY_TIMEOUT):
        resp = raw(agent, head("POST", INFER, {"Content-Length": "1000"}) + b'{"inputs": [')
        assert resp.status == 408


def test_max_connections(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo, max_connections=3, api_key_open_paths=OPEN_PATHS) as agent:
        agent.client.close()
        # The connections of the limit, one of them for reading /metrics: opened until one
        # beyond is refused (a connection of the test's own client may still count).
        held = []
        try:
            while True:
                sock = connect(agent.url)
                sock.sendall(head("GET", "/v2/health/live"))
                if read_response(sock).status == 503:
                    sock.close()
                    break
                held.append(sock)
            assert held, "the first connection was refused"

            def scrape() -> dict[str, float]:
                held[0].sendall(head("GET", "/metrics"))
                text = read_response(held[0]).body.decode()
                families = text_string_to_metric_families(text)
                refused = next(f for f in families if f.name == "edgefleet_requests_refused")
                return {s.labels["reason"]: s.value for s in refused.samples}

            counted = scrape()
            assert counted[RefusalReason.MAX_CONNECTIONS] == 1, counted
            assert sum(counted.values()) == 1, counted
        finally:
            for sock in held:
                sock.close()


def test_max_concurrent_requests(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo, max_concurrent_requests=2, api_key_open_paths=OPEN_PATHS) as agent:
        held = [connect(agent.url) for _ in range(2)]
        try:
            with refused_once(agent, RefusalReason.MAX_CONCURRENT_REQUESTS):
                for sock in held:  # in flight until their bodies come: they never do
                    sock.sendall(head("POST", INFER, {"Content-Length": "100"}))
                # a request the agent serves (and counts nowhere) until those two are in
                wait_until(
                    lambda: raw(agent, head("GET", "/v2")).status == 503,
                    what="two requests in flight",
                )
        finally:
            for sock in held:
                sock.close()


def test_max_inflight_body_bytes_declared(agent: RunningAgent) -> None:
    with connect(agent.url) as holder:
        holder.sendall(head("POST", INFER, {"Content-Length": str(3 * MiB // 2)}))
        with refused_once(agent, RefusalReason.MAX_INFLIGHT_BODY_BYTES):
            resp = raw(agent, head("POST", INFER, {"Content-Length": str(MiB)}))
            assert resp.status == 503 and resp.headers["retry-after"] == "1", resp
            assert "max_inflight_body_bytes=2097152" in resp.json()["error"]


def test_max_inflight_body_bytes_a_body_over_it_alone(agent: RunningAgent) -> None:
    """Under max_request_bytes but over the whole budget: it could never fit, so 413."""
    with refused_once(agent, RefusalReason.MAX_INFLIGHT_BODY_BYTES):
        resp = raw(agent, head("POST", INFER, {"Content-Length": str(3 * MiB)}))
        assert resp.status == 413 and resp.json()["code"] == "payload_too_large", resp
        assert "max_inflight_body_bytes=2097152" in resp.json()["error"]


def test_max_inflight_body_bytes_chunked(agent: RunningAgent) -> None:
    chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
    with refused_once(agent, RefusalReason.MAX_INFLIGHT_BODY_BYTES), connect(agent.url) as sock:
        sock.sendall(head("POST", INFER, {"Transfer-Encoding": "chunked"}))
        try:
            for _ in range(48):  # 3 MiB at most: refused past 2 MiB, before 4 MiB (the 413)
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed after its answer
        resp = read_response(sock)
        assert resp.status == 503 and "max_inflight_body_bytes" in resp.json()["error"]
        assert closed_by_peer(sock)


# -- the application: admission, body limits, decoding, models, queues -------------------------


@pytest.mark.parametrize("path", ["/v2", INFER], ids=["admission", "infer-fast-path"])
def test_unauthorized(keyed: RunningAgent, path: str) -> None:
    with refused_once(keyed, RefusalReason.UNAUTHORIZED):
        assert raw(keyed, post(path, b"{}")).status == 401


def test_rate_limited(keyed: RunningAgent) -> None:
    with refused_once(keyed, RefusalReason.RATE_LIMITED):
        # the burst is spent (by this test, or an earlier one), then one refusal
        while (status := raw(keyed, head("GET", "/v2", {"X-API-Key": KEY})).status) == 200:
            pass
        assert status == 429


BOMB = gzip.compress(b" " * (8 * MiB))  # 8 KB, inflating past max_request_bytes


@pytest.mark.parametrize(
    "request_",
    [
        head("POST", INFER, {"Content-Length": str(5 * MiB)}),
        post(INFER, BOMB, **{"Content-Encoding": "gzip"}),
        post("/v1/models/mlp:predict", BOMB, **{"Content-Encoding": "gzip"}),
    ],
    ids=["declared", "inflated", "inflated-tf"],
)
def test_max_request_bytes(agent: RunningAgent, request_: bytes) -> None:
    with refused_once(agent, RefusalReason.MAX_REQUEST_BYTES):
        assert raw(agent, request_).status == 413


def _json(doc: object) -> bytes:
    return httpx.Request("POST", "http://x", json=doc).content


CASES: dict[str, tuple[RefusalReason, str, bytes, int]] = {
    # (reason, path, body, status)
    "bad-json": (RefusalReason.BAD_JSON, INFER, b"{not json", 400),
    # 64 KiB or more: answered from the connection's callbacks (InferFastPath.start)
    "bad-json-whole-body": (RefusalReason.BAD_JSON, INFER, b"{" * 70_000, 400),
    "bad-json-tf": (RefusalReason.BAD_JSON, "/v1/models/mlp:predict", b"{not json", 400),
    "null-value": (RefusalReason.NULL_VALUE, INFER, _json(v2([None] * 256)), 400),
    "null-value-tf": (
        RefusalReason.NULL_VALUE,
        "/v1/models/mlp:predict",
        _json({"instances": [[None] * 256]}),
        400,
    ),
    "invalid-request": (RefusalReason.INVALID_REQUEST, INFER, _json({"inputs": []}), 400),
    "invalid-request-shape": (
        RefusalReason.INVALID_REQUEST,
        INFER,
        _json(
            {"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [0] * 3}]}
        ),
        400,
    ),
    "model-not-found": (RefusalReason.MODEL_NOT_FOUND, "/v2/models/nope/infer", b"{}", 404),
    "model-not-ready": (RefusalReason.MODEL_NOT_READY, "/v2/models/broken/infer", b"{}", 503),
}


@pytest.mark.parametrize("case", list(CASES))
def test_application_refusal(agent: RunningAgent, case: str) -> None:
    reason, path, body, status = CASES[case]
    with refused_once(agent, reason):
        resp = raw(agent, post(path, body, **{"Content-Type": "application/json"}))
        assert resp.status == status, resp


def test_model_not_found_on_a_routed_endpoint(agent: RunningAgent) -> None:
    with refused_once(agent, RefusalReason.MODEL_NOT_FOUND):
        assert agent.client.get("/v2/models/nope").status_code == 404


def queue_depth(agent: RunningAgent) -> float:
    for family in text_string_to_metric_families(httpx.get(agent.url + "/metrics").text):
        if family.name == "edgefleet_queue_depth":
            return sum(s.value for s in family.samples if s.labels["model"] == "mlp")
    return 0.0


def test_queue_full(agent: RunningAgent, gate: Gate) -> None:
    """One request held in the model, one in its queue (``max_queue_size = 1``): the next is
    turned away."""
    gate.close()
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(agent.infer_json, "mlp", [ROW])
            gate.wait_entered()
            second = pool.submit(agent.infer_json, "mlp", [ROW])
            wait_until(lambda: queue_depth(agent) == 1, what="a request in the queue")
            with refused_once(agent, RefusalReason.QUEUE_FULL):
                with httpx.Client(base_url=agent.url) as client:
                    resp = client.post(INFER, json=v2(ROW))
                assert resp.status_code == 503 and resp.json()["code"] == "overloaded"
            gate.open()
            assert [first.result(60).status_code, second.result(60).status_code] == [200, 200]
    finally:
        gate.open()


def test_shutting_down(agent: RunningAgent) -> None:
    """A new request in the moment the agent stops taking work (its lifespan's shutdown)."""
    service = agent.state.service
    service.accepting = False
    try:
        with refused_once(agent, RefusalReason.SHUTTING_DOWN):
            resp = raw(agent, post(INFER, _json(v2(ROW))))
            assert resp.status == 503 and resp.json()["code"] == "shutting_down"
    finally:
        service.accepting = True
