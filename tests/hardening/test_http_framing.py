"""How requests enter and responses leave the agent's HTTP protocol, over raw sockets: a body
with a declared length is collected whole however it is split; a response's head is held until
its body so both go in one write, without breaking what holds or has no body (HEAD,
``100 Continue``, pipelined requests, a connection closed after its answer)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.http.answers import HeadHeld
from tests.agent.server import RunningAgent, copy_models, serve
from tests.hardening.rawhttp import closed_by_peer, connect, head, read_response

INFER = "/v2/models/mlp/infer"
BODY = json.dumps(
    {"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": [0.5] * 256}]}
).encode()


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = copy_models(example_repo, tmp_path_factory.mktemp("repo"), "mlp")
    with serve(repo) as running:
        yield running


def infer_head(**extra: str) -> bytes:
    headers = {"Content-Type": "application/json", "Content-Length": str(len(BODY)), **extra}
    return head("POST", INFER, headers)


class Recorder:
    """A transport that records what is written to it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: Iterable[bytes]) -> None:
        self.writes.append(b"".join(parts))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def held(recorder: Recorder) -> HeadHeld:
    return HeadHeld(recorder)  # type: ignore[arg-type]


def test_a_head_and_its_body_leave_in_one_write() -> None:
    recorder = Recorder()
    writer = held(recorder)
    for body in (b"{}", b"x" * 100_000):  # small: joined; large: one vectored write
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        assert recorder.writes == [] or recorder.writes[-1].endswith(b"{}")
        writer.write(body)
        writer.next_response()
        assert recorder.writes[-1] == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n" + body
    assert len(recorder.writes) == 2


def test_a_head_without_a_body_leaves_when_the_response_ends_or_closes() -> None:
    recorder = Recorder()
    writer = held(recorder)
    writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    writer.next_response()  # a HEAD answer, a 204: no body write ever comes
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    writer.close()  # uvicorn closes a connection: close before its response ends
    assert recorder.writes == [
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
    ]
    assert recorder.closed


def test_100_continue_is_not_held() -> None:
    recorder = Recorder()
    writer = held(recorder)
    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert recorder.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
    writer.write(b"a")
    writer.write(b"b")  # a streamed body's later chunks go straight out
    assert recorder.writes[1:] == [b"HTTP/1.1 200 OK\r\n\r\na", b"b"]


def read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(1)  # byte by byte: nothing after the head is consumed
    return data


def test_a_head_request_gets_a_head_alone_and_the_connection_goes_on(
    agent: RunningAgent,
) -> None:
    with connect(agent.url) as sock:
        sock.sendall(head("HEAD", "/v2"))  # 405 (GET only), a head with a length and no body
        assert b"content-length: 31" in read_head(sock)
        sock.sendall(head("GET", "/v2"))
        assert read_response(sock).json()["name"] == "edgefleet"


def test_100_continue_is_sent_before_the_body_is(agent: RunningAgent) -> None:
    with connect(agent.url) as sock:
        sock.sendall(infer_head(Expect="100-continue"))
        assert read_head(sock) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(BODY)
        answer = read_response(sock)
        assert answer.status == 200
        out = np.asarray(answer.json()["outputs"][0]["data"])
        assert out.shape == (10,) and np.isfinite(out).all()


def test_pipelined_requests_are_answered_in_order(agent: RunningAgent) -> None:
    with connect(agent.url) as sock:
        sock.sendall(
            head("GET", "/v2/models/mlp") + infer_head() + BODY + head("GET", "/v2/health/ready")
        )
        bodies = _pipelined_answers(sock, b'{"ready":true}')
    assert [sorted(b)[:2] for b in bodies] == [
        ["inputs", "name"],
        ["id", "model_name"],
        ["ready"],
    ]


def _pipelined_answers(sock: socket.socket, last: bytes) -> list[Any]:
    """The JSON bodies of 200 answers up to the one ending with ``last``: answers may share
    reads, so they are split by their lengths."""
    data = b""
    while not data.endswith(last):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    bodies = []
    while data:
        raw_head, _, rest = data.partition(b"\r\n\r\n")
        assert raw_head.startswith(b"HTTP/1.1 200 OK\r\n")
        length = int(raw_head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        bodies.append(json.loads(rest[:length]))
        data = rest[length:]
    return bodies


def test_connection_close_is_answered_then_closed(agent: RunningAgent) -> None:
    with connect(agent.url) as sock:
        sock.sendall(infer_head(Connection="close") + BODY)
        answer = read_response(sock)
        assert answer.status == 200 and "outputs" in answer.json()
        assert closed_by_peer(sock)


def _rows_body(rows: int) -> tuple[bytes, np.ndarray]:
    x = np.random.default_rng(rows).standard_normal((rows, 256)).astype(np.float32)
    data = x.ravel().tolist()
    doc = {"inputs": [{"name": "input", "shape": [rows, 256], "datatype": "FP32", "data": data}]}
    return json.dumps(doc).encode(), x


def test_a_body_in_many_packets_is_collected_whole_and_exact(agent: RunningAgent) -> None:
    body, x = _rows_body(64)  # about 330 KB: over uvicorn's 64 KiB step five times
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    with connect(agent.url) as sock:
        sock.sendall(head("POST", INFER, headers) + body)
        at_once = read_response(sock)
        sock.sendall(head("POST", INFER, headers))
        for start in range(0, len(body), 50_000):
            time.sleep(0.005)  # separate packets, each its own data_received
            sock.sendall(body[start : start + 50_000])
        in_pieces = read_response(sock)
    assert at_once.status == in_pieces.status == 200
    out = at_once.json()["outputs"][0]
    assert out["shape"] == [64, 10] and in_pieces.json()["outputs"] == at_once.json()["outputs"]


def test_large_bodies_read_past_the_parser_are_the_bytes_sent(agent: RunningAgent) -> None:
    """A large body lands in a buffer that is not zero-filled, and on a connection that has had
    one its next head is read in small reads: the model must see exactly the rows sent, as it
    does from small bodies that take neither path."""
    body, x = _rows_body(64)
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    with connect(agent.url) as sock:
        answers = []
        for _ in range(3):  # the first switches the connection to reading into the buffer
            sock.sendall(head("POST", INFER, headers) + body)
            answers.append(read_response(sock))
        singles = []
        for row in x[:8]:
            tensor = {"name": "input", "shape": [1, 256], "datatype": "FP32", "data": row.tolist()}
            small = json.dumps({"inputs": [tensor]}).encode()
            sock.sendall(head("POST", INFER, {"Content-Length": str(len(small))}) + small)
            singles.append(read_response(sock))
    assert len(body) > 300_000 and all(a.status == 200 for a in answers + singles)
    large = [np.array(a.json()["outputs"][0]["data"]).reshape(64, 10) for a in answers]
    rows = np.array([s.json()["outputs"][0]["data"] for s in singles])
    for out in large:
        np.testing.assert_allclose(out[:8], rows, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out, large[0])


def test_a_chunked_body_without_a_length_still_arrives_in_steps(agent: RunningAgent) -> None:
    body, _ = _rows_body(64)
    chunked = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 40_000]), body[i : i + 40_000])
        for i in range(0, len(body), 40_000)
    )
    headers = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    with connect(agent.url) as sock:
        sock.sendall(head("POST", INFER, headers) + chunked + b"0\r\n\r\n")
        answer = read_response(sock)
    assert answer.status == 200 and answer.json()["outputs"][0]["shape"] == [64, 10]


def test_a_body_read_past_the_parser_leaves_a_pipelined_request_whole(
    agent: RunningAgent,
) -> None:
    """The part of a body after its first packet is read straight into the body's buffer, never
    further: a request sent right behind it is parsed as the next one."""
    body, _ = _rows_body(128)  # about 660 KB: more than one read of the connection's buffer
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    with connect(agent.url) as sock:
        sock.sendall(head("POST", INFER, headers) + body + head("GET", "/v2/health/ready"))
        bodies = _pipelined_answers(sock, b'{"ready":true}')
    assert bodies[0]["outputs"][0]["shape"] == [128, 10]
    assert bodies[1:] == [{"ready": True}]


def test_a_client_gone_halfway_through_a_body_costs_nothing_else(agent: RunningAgent) -> None:
    body, _ = _rows_body(128)
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    with connect(agent.url) as sock:
        sock.sendall(head("POST", INFER, headers) + body[: len(body) // 2])
        time.sleep(0.05)  # the first half is read into the body's buffer before the close
    with connect(agent.url) as sock:
        sock.sendall(infer_head() + BODY)
        answer = read_response(sock)
    assert answer.status == 200 and "outputs" in answer.json()


@pytest.mark.parametrize(
    ("method", "path", "upgrade", "size"),
    [
        ("GET", "/v2/models/mlp/ready", "websocket", 0),
        ("POST", INFER, "h2c", 0),  # curl --http2 on http:// asks for this
        ("POST", INFER, "h2c", 64),  # a body collected whole into a buffer not zero-filled
    ],
)
def test_a_protocol_upgrade_is_refused_and_leaks_neither_memory_nor_a_request_slot(
    example_repo: Path, tmp_path: Path, method: str, path: str, upgrade: str, size: int
) -> None:
    """httptools treats an upgrade request as having no body: the handler once got a buffer
    nothing had filled (earlier requests' memory, answered as model output), and a WebSocket
    upgrade took a request slot for good (each one: with the default limit, 256 of them
    refused every request while the health probes said ready)."""
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo, max_concurrent_requests=1) as agent:
        body, _ = _rows_body(size) if size else (b"", None)
        headers = {"Connection": "Upgrade", "Upgrade": upgrade}
        if upgrade == "websocket":
            headers |= {
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Version": "13",
            }
        if body:
            headers |= {"Content-Type": "application/json", "Content-Length": str(len(body))}
        for _ in range(3):
            with connect(agent.url) as sock:
                sock.sendall(head(method, path, headers) + body)
                answer = read_response(sock)
                assert answer.status == 400, answer.body[:200]
                assert answer.json()["code"] == "upgrade_not_supported"
                assert f"Upgrade: {upgrade}" in answer.json()["error"]
                assert closed_by_peer(sock)
        # the one request slot is free: served, not 503
        with connect(agent.url) as sock:
            sock.sendall(infer_head() + BODY)
            assert read_response(sock).status == 200


def test_a_request_answered_before_its_body_came_leaves_the_connection_as_it_was(
    agent: RunningAgent,
) -> None:
    """A 404 goes out as soon as the head names no model; the body that follows is dropped, and
    the next request on the connection gets its own answer (not one about the dropped body)."""
    path = "/v2/models/nope/infer"
    with connect(agent.url) as sock:
        sock.sendall(head("POST", path, {"Content-Length": str(len(BODY))}))
        assert read_response(sock).status == 404  # before its body was sent
        sock.sendall(BODY + head("GET", "/v2/health/live"))
        answer = read_response(sock)
        assert answer.status == 200 and answer.json() == {"live": True}, answer.body
