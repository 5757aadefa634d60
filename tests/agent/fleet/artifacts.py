"""A real HTTP artifact server on 127.0.0.1 (uvicorn in a thread) serving files by sha256,
with Range requests, and faults the tests switch on: cut a download short, send a different
body, pause a download until released."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.agent.server import wait_until
from tests.mqtt_broker import free_port


@dataclass
class Fault:
    drop_after_bytes: int | None = None
    """Abort the connection after this many bytes (once, then serve normally)."""
    serve_bytes: bytes | None = None
    """Serve these bytes instead of the file (a tampered or truncated artifact)."""
    hold: threading.Event | None = None
    """Send the first 64 KiB, then wait for this event before the rest."""
    times: int = 1


@dataclass
class ArtifactServer:
    root: Path
    url: str = ""
    faults: dict[str, Fault] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    """(sha256, Range header) of every request, in order."""

    def add(self, path: Path) -> tuple[str, int, str]:
        """Publish a file; return (sha256, size, url)."""
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (self.root / digest).write_bytes(data)
        return digest, len(data), f"{self.url}/artifacts/sha256/{digest}"

    async def _serve(self, request: Request) -> Response:
        digest = request.path_params["digest"]
        self.requests.append((digest, request.headers.get("range")))
        path = self.root / digest
        if not path.is_file():
            return Response(status_code=404)
        fault = self.faults.get(digest)
        if fault is not None and fault.times > 0:
            fault.times -= 1
        else:
            fault = None
        data = fault.serve_bytes if fault and fault.serve_bytes is not None else path.read_bytes()
        start = 0
        if request.headers.get("range", "").startswith("bytes="):
            start = int(request.headers["range"][6:].split("-")[0])
        body = data[start:]
        headers = {"Content-Length": str(len(body)), "Accept-Ranges": "bytes"}
        status = 200
        if start:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"

        async def stream() -> AsyncIterator[bytes]:
            import asyncio

            sent = 0
            for offset in range(0, len(body), 65536):
                chunk = body[offset : offset + 65536]
                if (
                    fault
                    and fault.drop_after_bytes is not None
                    and sent + len(chunk) > fault.drop_after_bytes
                ):
                    yield chunk[: fault.drop_after_bytes - sent]
                    raise ConnectionAbortedError("fault: dropped mid-download")
                if fault and fault.hold is not None and sent >= 65536:
                    await asyncio.to_thread(fault.hold.wait, 60)
                yield chunk
                sent += len(chunk)

        return StreamingResponse(stream(), status_code=status, headers=headers)


@contextmanager
def artifact_server(root: Path) -> Iterator[ArtifactServer]:
    root.mkdir(parents=True, exist_ok=True)
    server_state = ArtifactServer(root)
    app = Starlette(routes=[Route("/artifacts/sha256/{digest}", server_state._serve)])
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", loop="asyncio")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="the artifact server")
    server_state.url = f"http://127.0.0.1:{port}"
    try:
        yield server_state
    finally:
        server.should_exit = True
        thread.join(timeout=30)
