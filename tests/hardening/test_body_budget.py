"""The agent's budget for request bodies in flight (``max_inflight_body_bytes``), on a real agent
process over raw sockets on 127.0.0.1, its resident memory read with psutil.

The agent runs with the cycle collector off (``gc.disable()`` before it starts), so a body that
only the collector would free shows as memory that stays. Its allocator's mmap threshold is
fixed at glibc's initial 128 KiB (``MALLOC_MMAP_THRESHOLD_``): glibc otherwise raises it as
large blocks are freed and keeps later ones in its heap for reuse, and RSS would then measure
the allocator, not whether the agent let go of a body (bodies of 48 MiB are past any threshold
and mapped on their own either way).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from agent.http.limits import default_body_budget_bytes
from tests.agent.server import copy_models, serve, wait_until
from tests.hardening.rawhttp import closed_by_peer, connect, head, read_response
from tests.rss import PeakRss

INFER = "/v2/models/mlp/infer"
MiB = 2**20
BUDGET = 256 * MiB
"""max_inflight_body_bytes, set so that the figures below mean something on any machine."""
BODY = 48 * MiB
CONNECTIONS = 64
ADMITTED = BUDGET // BODY  # 5


@dataclass
class Agent:
    url: str
    process: psutil.Process

    def rss(self) -> int:
        return int(self.process.memory_info().rss)


@contextmanager
def agent_without_gc(repo: Path, env: dict[str, str]) -> Iterator[Agent]:
    """``edgefleet agent`` with the cycle collector disabled before anything of it is imported;
    ready when it has logged its address and its models serve."""
    code = "import gc; gc.disable(); from common.cli import main; main()"
    args = ["agent", "--model-repository", str(repo), "--port", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **env},
    )
    address: list[str] = []

    def read_logs() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("message") == "agent listening":
                address.append(str(record["address"]))

    reader = threading.Thread(target=read_logs, daemon=True)
    reader.start()
    try:
        wait_until(lambda: bool(address) or proc.poll() is not None, what="the agent to listen")
        assert address, f"the agent exited with {proc.returncode}"
        url = address[0]
        wait_until(lambda: httpx.get(f"{url}/v2/health/ready").status_code == 200, what="the model")
        yield Agent(url, psutil.Process(proc.pid))
    finally:
        proc.kill()
        proc.wait(timeout=30)
        reader.join(timeout=10)
        assert proc.stderr is not None
        proc.stderr.close()


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    repo = copy_models(example_repo, tmp_path_factory.mktemp("budget"), "mlp")
    env = {
        "EDGEFLEET_AGENT_MAX_INFLIGHT_BODY_BYTES": str(BUDGET),
        "EDGEFLEET_AGENT_BODY_TIMEOUT_S": "60",
        "EDGEFLEET_AGENT_ACCESS_LOG": "false",
        "MALLOC_MMAP_THRESHOLD_": str(128 * 2**10),
    }
    with agent_without_gc(repo, env) as running:
        yield running


def answered(socks: list[socket.socket], wait_s: float) -> list[socket.socket]:
    """The sockets with something to read (an answer) within ``wait_s``."""
    readable, _, _ = select.select(socks, [], [], wait_s)
    return readable


def serves(agent: Agent) -> bool:
    doc = {"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": [0] * 256}]}
    return httpx.post(agent.url + INFER, json=doc).status_code == 200


def test_bodies_in_flight_stay_within_the_budget(agent: Agent) -> None:
    """64 connections each declare 48 MiB: 5 fit the 256 MiB budget; the other 59 are refused
    before a byte of their body is read, and trickle on into a body the agent skips, while the
    5 trickle theirs to all but the last MiB. Memory stays under idle + budget + 64 MiB."""
    idle = agent.rss()
    socks = [connect(agent.url) for _ in range(CONNECTIONS)]
    try:
        for sock in socks:
            sock.sendall(head("POST", INFER, {"Content-Length": str(BODY)}))
        deadline = time.monotonic() + 30
        while len(answered(socks, 0.05)) < CONNECTIONS - ADMITTED:
            assert time.monotonic() < deadline, "the refusals did not come"
        refused = answered(socks, 0.3)  # and no more: the admitted wait for their bodies
        assert len(refused) == CONNECTIONS - ADMITTED
        for sock in refused:
            resp = read_response(sock)
            assert resp.status == 503 and resp.headers["retry-after"] == "1", resp
            assert resp.json()["code"] == "overloaded"
            assert f"max_inflight_body_bytes={BUDGET}" in resp.json()["error"]
        admitted = [s for s in socks if s not in refused]
        chunk = b" " * MiB
        with PeakRss(agent.process.pid) as rss:
            for _ in range(BODY // MiB - 1):  # every body one MiB short: none completes
                for sock in admitted:
                    sock.sendall(chunk)
                for sock in refused:  # skipped as it comes, held nowhere
                    sock.sendall(chunk[: 64 * 2**10])
                time.sleep(0.01)
            # the bodies are in: the agent holds what was sent (the figure means something)
            held = ADMITTED * (BODY - MiB)
            wait_until(lambda: agent.rss() - idle > 0.9 * held, 30, "the bodies to arrive")
            time.sleep(0.2)
        report = (
            f"idle {idle / MiB:.0f} MiB, peak {rss.peak / MiB:.0f} MiB (+{(rss.peak - idle) / MiB:.0f}"
            f" MiB) with {ADMITTED} bodies of {BODY // MiB} MiB in flight, budget {BUDGET // MiB} MiB"
        )
        print(report)
        assert rss.peak < idle + BUDGET + 64 * MiB, report
    finally:
        for sock in socks:
            sock.close()
    # the budget is given back with the connections: as many bodies fit again
    wait_until(lambda: declared_bodies_fit(agent, ADMITTED), 10, "the budget to be given back")
    assert serves(agent)


def declared_bodies_fit(agent: Agent, count: int) -> bool:
    """Whether ``count`` bodies of 48 MiB are admitted now: no answer comes to their heads."""
    socks = [connect(agent.url) for _ in range(count)]
    try:
        for sock in socks:
            sock.sendall(head("POST", INFER, {"Content-Length": str(BODY)}))
        return answered(socks, 0.3) == []
    finally:
        for sock in socks:
            sock.close()


def test_a_chunked_body_is_refused_as_soon_as_it_grows_past_the_budget(agent: Agent) -> None:
    """With 5 x 48 MiB declared (and nothing sent), 16 MiB are left: a chunked body is answered
    503 once it grows past them, long before its 64 MiB (``max_request_bytes``), and closed."""
    wait_until(lambda: declared_bodies_fit(agent, ADMITTED), 10, "the whole budget free")
    held = [connect(agent.url) for _ in range(ADMITTED)]
    try:
        for sock in held:
            sock.sendall(head("POST", INFER, {"Content-Length": str(BODY)}))
        assert answered(held, 0.3) == []
        chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
        sent = 0
        with connect(agent.url) as sock:
            sock.sendall(head("POST", INFER, {"Transfer-Encoding": "chunked"}))
            while sent < 64 * MiB and not answered([sock], 0):
                try:
                    sock.sendall(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    break  # closed after the answer, which is still to be read
                sent += 65536
            resp = read_response(sock)
            assert resp.status == 503 and resp.headers["retry-after"] == "1", resp
            assert "max_inflight_body_bytes" in resp.json()["error"]
            assert resp.headers["connection"] == "close" and closed_by_peer(sock)
        assert sent < 32 * MiB, f"{sent} bytes were read before the refusal"
    finally:
        for sock in held:
            sock.close()
    assert serves(agent)


def hold_half_bodies(agent: Agent, connections: int = 200) -> tuple[list[socket.socket], int]:
    """``connections`` clients that each sent half of a 1 MiB body; and RSS before them."""
    before = agent.rss()
    socks = []
    for _ in range(connections):
        sock = connect(agent.url)
        sock.sendall(head("POST", INFER, {"Content-Length": str(MiB)}) + b" " * (MiB // 2))
        socks.append(sock)
    half = connections * MiB // 2
    wait_until(lambda: agent.rss() - before > 0.8 * half, 30, "the half bodies to arrive")
    return socks, before


def back_within(agent: Agent, before: int, since: float, held: int, what: str) -> None:
    """RSS is back within 10 MB of ``before`` within 1 s of ``since``."""
    after = agent.rss()
    while after - before > 10_000_000 and time.monotonic() - since < 1.0:
        time.sleep(0.02)
        after = agent.rss()
    report = (
        f"before {before / 1e6:.1f} MB, with 200 half bodies {held / 1e6:.1f} MB, "
        f"{time.monotonic() - since:.2f} s after {what} {after / 1e6:.1f} MB"
    )
    print(report)
    assert after - before <= 10_000_000, report


def test_half_sent_bodies_of_clients_gone_are_freed_at_once_without_gc(agent: Agent) -> None:
    """200 clients send half of a 1 MiB body and vanish: the agent, its cycle collector off,
    is back within 10 MB of where it was within 1 s (before, it held all 100 MB until a
    collection: each body hung in the reference cycles of its request's objects)."""
    socks, before = hold_half_bodies(agent)
    held = agent.rss()
    for sock in socks:
        sock.close()
    back_within(agent, before, time.monotonic(), held, "the clients left")
    assert serves(agent)


def test_half_sent_bodies_past_their_deadline_are_freed_at_once_without_gc(
    example_repo: Path, tmp_path: Path
) -> None:
    """The same 200 half bodies, their clients still there: at ``body_timeout_s`` each gets its
    408 and its connection is closed, and the bodies are freed as at once."""
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    env = {
        "EDGEFLEET_AGENT_MAX_INFLIGHT_BODY_BYTES": str(BUDGET),
        "EDGEFLEET_AGENT_BODY_TIMEOUT_S": "2",
        "EDGEFLEET_AGENT_ACCESS_LOG": "false",
        "MALLOC_MMAP_THRESHOLD_": str(128 * 2**10),
    }
    with agent_without_gc(repo, env) as agent:
        socks, before = hold_half_bodies(agent)
        try:
            held = agent.rss()
            for sock in socks:
                assert read_response(sock).status == 408
            back_within(agent, before, time.monotonic(), held, "the last 408")
        finally:
            for sock in socks:
                sock.close()
        assert serves(agent)


def fits_whole_budget(url: str, budget: int) -> bool:
    """Whether a body of the whole budget is admitted now (nothing is taken from it): no answer
    comes to its head."""
    with connect(url) as sock:
        sock.sendall(head("POST", INFER, {"Content-Length": str(budget)}))
        return answered([sock], 0.2) == []


def test_every_kind_of_request_gives_its_bytes_back(example_repo: Path, tmp_path: Path) -> None:
    """Bodies small and large (answered from the connection's callbacks), chunked, answered
    before they are in, pipelined, refused, cut off: afterwards a body of the whole budget fits
    again. A byte not given back would end in every request refused."""
    budget = MiB
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo, max_inflight_body_bytes=budget, max_request_bytes=budget) as agent:
        small = httpx.Request("POST", "http://x", json=v2_body(1)).content
        large = httpx.Request("POST", "http://x", json=v2_body(80)).content
        assert len(small) < 64 * 2**10 <= len(large) < budget
        assert agent.client.post(INFER, content=small).status_code == 200
        assert agent.client.post(INFER, content=large).status_code == 200
        assert (
            agent.client.post(INFER, content=iter([large[:1000], large[1000:]])).status_code == 200
        )
        assert agent.client.post(INFER, content=b"{" * 100_000).status_code == 400
        assert agent.client.post("/v2/models/nope/infer", content=large).status_code == 404
        assert agent.client.get("/v2/models/mlp").status_code == 200
        with connect(agent.url) as sock:  # pipelined: three requests in one write
            one = head("POST", INFER, {"Content-Length": str(len(large))}) + large
            sock.sendall(one + head("GET", "/v2") + one)
            assert pipelined_statuses(sock, 3) == [200, 200, 200]
        with connect(agent.url) as sock:  # refused: over the budget alone
            sock.sendall(head("POST", INFER, {"Content-Length": str(budget + 1)}))
            assert read_response(sock).status == 413
        for data in (small, large):  # cut off half-way
            with connect(agent.url) as sock:
                sock.sendall(head("POST", INFER, {"Content-Length": str(len(data))}))
                sock.sendall(data[: len(data) // 2])
        wait_until(lambda: fits_whole_budget(agent.url, budget), 10, "the budget to be whole")


def pipelined_statuses(sock: socket.socket, count: int) -> list[int]:
    """The statuses of ``count`` responses in a row (``read_response`` reads one response and
    drops what follows it in the same read)."""
    stream = sock.makefile("rb")
    statuses = []
    for _ in range(count):
        statuses.append(int(stream.readline().split()[1]))
        length = 0
        while (line := stream.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        stream.read(length)
    return statuses


def v2_body(rows: int) -> dict[str, object]:
    data = [0.0] * (rows * 256)
    return {"inputs": [{"name": "input", "shape": [rows, 256], "datatype": "FP32", "data": data}]}


GiB = 2**30


@pytest.mark.parametrize(
    ("memory_budget", "max_request", "expected"),
    [
        (3 * GiB, 64 * MiB, 768 * MiB),  # a 4 GiB board: a quarter of its 3 GiB model budget
        (12 * GiB, 64 * MiB, GiB),  # the ceiling
        (192 * MiB, 16 * MiB, 64 * MiB),  # the floor
        (None, 64 * MiB, 256 * MiB),  # memory not known
        (GiB, 512 * MiB, 512 * MiB),  # never under one body of max_request_bytes
    ],
)
def test_the_default_budget_is_a_share_of_the_memory_budget(
    memory_budget: int | None, max_request: int, expected: int
) -> None:
    assert default_body_budget_bytes(memory_budget, max_request) == expected
