"""HTTP/1.1 by hand over a socket, for what httpx will not send: trickled heads and bodies,
oversized headers, connections held idle."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def connect(url: str, timeout_s: float = 30.0) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def head(method: str, path: str, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def read_response(sock: socket.socket) -> RawResponse:
    """One response: the head, then Content-Length bytes (or up to the close)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head: {data!r}")
        data += chunk
    raw_head, body = data.split(b"\r\n\r\n", 1)
    lines = raw_head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    length = int(headers.get("content-length", "-1"))
    while length < 0 or len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return RawResponse(status, headers, body[:length] if length >= 0 else body)


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server has closed the connection (reads EOF, or a reset)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def request(url: str, data: bytes, timeout_s: float = 30.0) -> RawResponse:
    with connect(url, timeout_s) as sock:
        sock.sendall(data)
        return read_response(sock)
