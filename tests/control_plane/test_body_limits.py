"""Request bodies and the control plane's API: the token and role are checked before a byte of
the body is read, and a JSON body is bounded by ``max_json_body_bytes`` while it is read (413
beyond, whatever its framing); uploads keep ``max_upload_bytes``.

FastAPI reads and parses a body *parameter* before it solves any dependency, the token check
included, so these are the cases that tell the order apart: a body that is not JSON, one over
the limit, and one of 100 MiB, sent to a real control plane process whose memory is watched."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from control_plane.settings import ControlPlaneSettings
from tests.control_plane.conftest import ControlPlaneFactory
from tests.faults.cp_process import ControlPlaneProcess, control_plane_process
from tests.mqtt_broker import Mosquitto, free_port
from tests.rss import PeakRss

MiB = 2**20
LIMIT = 2**20
"""The default ``max_json_body_bytes``."""
HUGE = 100 * MiB
RSS_GROWTH_BOUND = 10_000_000

# the routes that take a JSON body, and the role each needs
JSON_ROUTES = [
    ("POST", "/api/v1/models/m/versions", "operator"),
    ("POST", "/api/v1/models/m/versions/1/stage", "operator"),
    ("PATCH", "/api/v1/devices/d/labels", "operator"),
    ("POST", "/api/v1/rollouts", "operator"),
    ("POST", "/api/v1/tokens", "admin"),
]
VERSION = {"version": 1, "variants": [{"format": "onnx", "profiles": []}]}


def padded(doc: object, size: int) -> bytes:
    """``doc`` as JSON of exactly ``size`` bytes (trailing whitespace is valid JSON)."""
    raw = orjson.dumps(doc)
    return raw + b" " * (size - len(raw))


def chunks(total: int, chunk: int = MiB) -> Iterator[bytes]:
    """A body of ``total`` bytes that is not JSON, made as it is sent."""
    block = b"x" * chunk
    for start in range(0, total, chunk):
        yield block[: min(chunk, total - start)]


def raw_request(
    port: int, path: str, headers: dict[str, str], body: Iterable[bytes] = ()
) -> tuple[int, dict[str, object]]:
    """One request over a plain socket (so its head can declare what its body is not), the body
    sent until the server stops taking it, then the answer's status and JSON body."""
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.encode())
        try:
            for chunk in body:
                sock.sendall(chunk)
        except OSError:
            pass  # answered and closed before the body was all sent: read the answer
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            assert data, f"closed without an answer: {answer!r}"
            answer += data
        top, _, rest = answer.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", top)[1])  # type: ignore[index]
        while len(rest) < length:
            data = sock.recv(65536)
            assert data, "closed mid-answer"
            rest += data
    return int(top.split()[1]), orjson.loads(rest[:length])


@pytest.fixture
def cp_process(tmp_path: Path, broker: Mosquitto) -> Iterator[ControlPlaneProcess]:
    """``edgefleet control-plane`` as a process of its own, so its memory is its own."""
    db = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
    with control_plane_process(tmp_path / "cp", db, broker.url, free_port()) as cp:
        yield cp


def test_a_100_mib_body_is_refused_unread_and_memory_stays_flat(
    cp_process: ControlPlaneProcess,
) -> None:
    cp, port = cp_process, int(cp_process.url.rsplit(":", 1)[1])
    token = str(cp.admin.headers["authorization"])
    declared = {"Content-Type": "application/json", "Content-Length": str(HUGE)}
    growth = {}
    with httpx.Client(base_url=cp.url, timeout=120) as anonymous:
        # every path measured below taken once first, so what is measured is the body alone
        for auth in ({}, {"Authorization": token}):
            anonymous.post("/api/v1/rollouts", content=chunks(2 * LIMIT), headers=auth)
            small = {"Content-Length": str(2 * LIMIT)}
            raw_request(port, "/api/v1/rollouts", {**auth, **small}, chunks(2 * LIMIT))
        cases = {
            "unauthenticated, Content-Length": (None, 401),
            "unauthenticated, chunked": (None, 401),
            "authenticated, Content-Length": (token, 413),
            "authenticated, chunked": (token, 413),
        }
        for case, (auth, expected) in cases.items():
            headers = {"Authorization": auth} if auth else {}
            with PeakRss(cp.proc.pid, interval_s=0.005, settle_s=0.3) as rss:
                if case.endswith("chunked"):  # no length: the server learns the size by reading
                    resp = anonymous.post(
                        "/api/v1/rollouts",
                        content=chunks(HUGE),
                        headers={**headers, "Content-Type": "application/json"},
                    )
                    status, body = resp.status_code, resp.json()
                else:
                    status, body = raw_request(
                        port, "/api/v1/rollouts", {**declared, **headers}, chunks(HUGE)
                    )
            assert status == expected, (case, body)
            growth[case] = rss.growth
    print("RSS growth per 100 MiB body:", {k: f"{v / 1e6:.1f} MB" for k, v in growth.items()})
    assert all(g < RSS_GROWTH_BOUND for g in growth.values()), growth
    assert cp.admin.get("/api/v1/rollouts").json() == []


def test_the_json_routes_check_token_and_role_before_the_body(
    start_control_plane: ControlPlaneFactory,
) -> None:
    with start_control_plane() as cp, httpx.Client(base_url=cp.url) as client:
        viewer, operator = cp.token("viewer"), cp.token("operator")
        unknown = "efp_0000000000000000_" + "x" * 43
        bodies = [b"{not json", b'{"unexpected": 1}', b"", b"x" * (2 * LIMIT)]
        for method, path, role in JSON_ROUTES:
            refusals = [(None, 401), (unknown, 401), (viewer, 403)]
            if role == "admin":
                refusals.append((operator, 403))
            for token, status in refusals:
                for body in bodies:
                    headers = {"Content-Type": "application/json"}
                    if token:
                        headers["Authorization"] = f"Bearer {token}"
                    resp = client.request(method, path, content=body, headers=headers)
                    assert resp.status_code == status, (method, path, token, body[:20], resp.text)
                    assert resp.json()["code"] == ("unauthorized" if status == 401 else "forbidden")
        # and every route that takes a body at all: the path's own values are not looked at
        # either (each placeholder is "1", which "kind" is not)
        paths = cp.admin.get("/openapi.json").json()["paths"]
        routes = [
            (method.upper(), re.sub(r"\{[^}]+\}", "1", path))
            for path, operations in paths.items()
            for method in operations
            if method in ("post", "put", "patch")
        ]
        assert len(routes) >= 11, routes
        for method, path in routes:
            resp = client.request(method, path, content=b"{not json")
            assert resp.status_code == 401, (method, path, resp.text)
            assert resp.headers["www-authenticate"] == "Bearer"


def test_json_bodies_over_the_limit_are_413_naming_it_and_uploads_keep_theirs(
    start_control_plane: ControlPlaneFactory,
) -> None:
    with start_control_plane() as cp:
        port = int(cp.url.rsplit(":", 1)[1])
        url = "/api/v1/models/m/versions"
        json_type = {"Content-Type": "application/json"}

        def over(resp: httpx.Response) -> bool:
            error = resp.json()
            return (
                resp.status_code == 413
                and error["code"] == "payload_too_large"
                and f"over the limit of {LIMIT} bytes (max_json_body_bytes)" in error["error"]
            )

        # exactly the limit is taken; a byte more is not, however it is framed
        resp = cp.admin.post(
            url, content=padded({**VERSION, "version": 1}, LIMIT), headers=json_type
        )
        assert resp.status_code == 201, resp.text
        resp = cp.admin.post(
            url, content=padded({**VERSION, "version": 2}, LIMIT + 1), headers=json_type
        )
        assert over(resp), resp.text
        body = padded({**VERSION, "version": 2}, LIMIT)
        resp = cp.admin.post(url, content=iter([body[:1000], body[1000:]]), headers=json_type)
        assert resp.status_code == 201 and "content-length" not in resp.request.headers, resp.text
        body = padded({**VERSION, "version": 3}, LIMIT + 1)
        resp = cp.admin.post(url, content=iter([body[:1000], body[1000:]]), headers=json_type)
        assert over(resp), resp.text
        # a declared length over the limit is refused before a byte of the body arrives
        token = str(cp.admin.headers["authorization"])
        status, error = raw_request(
            port, url, {"Authorization": token, "Content-Length": str(HUGE)}
        )
        assert status == 413 and error["code"] == "payload_too_large", error
        versions = cp.admin.get("/api/v1/models").json()[0]["versions"]
        assert [v["version"] for v in versions] == [1, 2]
        # an upload far over the JSON limit is taken under max_upload_bytes
        sample = b"\x93NUMPY" + b"\0" * (3 * MiB)
        resp = cp.admin.put("/api/v1/models/m/versions/1/golden", content=sample)
        assert resp.status_code == 200 and resp.json()["size"] == len(sample), resp.text


def test_the_limit_is_a_setting(
    start_control_plane: ControlPlaneFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ControlPlaneSettings().max_json_body_bytes == LIMIT
    monkeypatch.setenv("EDGEFLEET_CP_MAX_JSON_BODY_BYTES", "4096")
    assert ControlPlaneSettings().max_json_body_bytes == 4096
    with start_control_plane(max_json_body_bytes=4096) as cp:
        url, json_type = "/api/v1/models/m/versions", {"Content-Type": "application/json"}
        resp = cp.admin.post(url, content=padded(VERSION, 4097), headers=json_type)
        assert resp.status_code == 413 and "limit of 4096 bytes" in resp.json()["error"]
        resp = cp.admin.post(url, content=padded(VERSION, 4096), headers=json_type)
        assert resp.status_code == 201, resp.text
