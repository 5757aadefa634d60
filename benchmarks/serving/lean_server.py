"""The leanest Python server of the V2 infer route: what any Python server pays on this machine.

Not a product and not a peer. For a well-formed request it does on the wire what the agent does,
and nothing more: no batching, validation, limits, deadlines, metrics or logs, and errors
answered in one line. uvloop runs one :class:`asyncio.BufferedProtocol` per connection. It reads
a request's head into a small buffer and the body straight into a buffer of its own, as the
agent does. The tensors go to ``instances`` single-threaded ONNX Runtime sessions, loaded as
the agent loads them. Each session has a thread of its own, and the threads share one queue.
The answer is written from the event loop.

Beside raw ONNX Runtime, it shows what any Python HTTP server costs on this machine: the
kernel's copies, the event loop's thread competing with the sessions for the cores and their
caches, and the client's share of the cores. Beside the agent, what the agent's features cost::

    python -m benchmarks.serving.lean_server --model-file models/cnn/1/model.onnx --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
import uvloop

from benchmarks.serving.serving import cpu_sessions
from runtimes.base import Runtime
from runtimes.datatypes import from_numpy, numpy_dtype

HEAD_READ_BYTES = 8 * 1024
MAX_HEAD_BYTES = 64 * 1024


@dataclass
class _Request:
    inputs: dict[str, np.ndarray]
    binary_output: bool
    model: str


class _Server:
    """The sessions, their threads and the queue feeding them."""

    def __init__(self, runtimes: list[Runtime], loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.work: queue.SimpleQueue[tuple[_Connection, _Request] | None] = queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._serve, args=(r,), name=f"lean-{i}", daemon=True)
            for i, r in enumerate(runtimes)
        ]
        for thread in self.threads:
            thread.start()

    def _serve(self, runtime: Runtime) -> None:
        while (item := self.work.get()) is not None:
            connection, request = item
            try:
                answer = _encode(request, runtime.infer(request.inputs))
            except Exception as exc:  # the client hears it; the thread goes on
                answer = _plain(500, str(exc))
            self.loop.call_soon_threadsafe(connection.answer, answer)

    def stop(self) -> None:
        for _ in self.threads:
            self.work.put(None)
        for thread in self.threads:  # a session closed under its thread would fail its run
            thread.join(timeout=10)


class _Connection(asyncio.BufferedProtocol):
    """One request at a time: the next one is parsed once the previous one is answered."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.head = bytearray(HEAD_READ_BYTES)
        self.pending = bytearray()  # read and not yet parsed
        self.body: memoryview | None = None  # the body being read, when one is
        self.filled = 0
        self.meta: tuple[str, int | None] = ("", None)  # path, binary header length
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.body is not None:
            return self.body[self.filled :]
        return memoryview(self.head)

    def buffer_updated(self, nbytes: int) -> None:
        if self.body is not None:
            self.filled += nbytes
            if self.filled == len(self.body):
                self._dispatch()
            return
        self.pending += memoryview(self.head)[:nbytes]
        if self.busy and len(self.pending) > MAX_HEAD_BYTES:  # a client far ahead: hold it
            self.transport.pause_reading()
        self._parse()

    def _parse(self) -> None:
        if self.busy:
            return
        end = self.pending.find(b"\r\n\r\n")
        if end < 0:
            if len(self.pending) > MAX_HEAD_BYTES:
                self._fail(431, "request head too large")
            return
        lines = bytes(self.pending[:end]).split(b"\r\n")
        method, path, _ = lines[0].decode("latin-1").split(" ", 2)
        length, header_length = 0, None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"inference-header-content-length":
                header_length = int(value)
        if method != "POST" or not path.endswith("/infer"):
            self._fail(404, f"{method} {path}: only POST .../infer is served")
            return
        self.meta = (path, header_length)
        body = memoryview(np.empty(length, np.uint8).data)
        arrived = min(length, len(self.pending) - end - 4)
        body[:arrived] = self.pending[end + 4 : end + 4 + arrived]
        del self.pending[: end + 4 + arrived]
        self.body, self.filled = body, arrived
        if arrived == length:
            self._dispatch()

    def _dispatch(self) -> None:
        assert self.body is not None
        body, self.body = self.body, None
        path, header_length = self.meta
        try:
            request = _decode(body, header_length, path.split("/")[3])
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            self._fail(400, f"bad request: {exc!r}")
            return
        self.busy = True
        self.server.work.put((self, request))

    def answer(self, response: bytes) -> None:
        if self.transport.is_closing():
            return
        self.transport.write(response)
        self.busy = False
        self.transport.resume_reading()
        if self.pending:  # a pipelined request waited for this answer
            self._parse()

    def _fail(self, status: int, message: str) -> None:
        self.transport.write(_plain(status, message, close=True))
        self.transport.close()


def _decode(body: memoryview, header_length: int | None, model: str) -> _Request:
    doc: dict[str, Any] = orjson.loads(body[:header_length] if header_length else body)
    inputs, offset = {}, header_length or 0
    for spec in doc["inputs"]:
        dtype, shape = numpy_dtype(spec["datatype"]), spec["shape"]
        if header_length is None:
            inputs[spec["name"]] = np.asarray(spec["data"], dtype).reshape(shape)
            continue
        size = spec["parameters"]["binary_data_size"]
        array = np.frombuffer(body[offset : offset + size], dtype).reshape(shape)
        inputs[spec["name"]] = array
        offset += size
    binary = bool(doc.get("parameters", {}).get("binary_data_output", False))
    return _Request(inputs, binary, model)


def _encode(request: _Request, outputs: dict[str, np.ndarray]) -> bytes:
    specs: list[dict[str, Any]] = []
    tensors = []
    for name, array in outputs.items():
        spec: dict[str, Any] = {"name": name, "datatype": from_numpy(array.dtype)}
        spec["shape"] = list(array.shape)
        if request.binary_output:
            tensors.append(array.tobytes())
            spec["parameters"] = {"binary_data_size": len(tensors[-1])}
        else:
            spec["data"] = array.ravel()
        specs.append(spec)
    doc = orjson.dumps(
        {"model_name": request.model, "outputs": specs}, option=orjson.OPT_SERIALIZE_NUMPY
    )
    if not request.binary_output:
        head = b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(doc)
        return b"HTTP/1.1 200 OK\r\n" + head + doc
    body = b"".join([doc, *tensors])
    head = (
        b"content-type: application/octet-stream\r\n"
        b"inference-header-content-length: %d\r\ncontent-length: %d\r\n\r\n"
    ) % (len(doc), len(body))
    return b"HTTP/1.1 200 OK\r\n" + head + body


def _plain(status: int, message: str, close: bool = False) -> bytes:
    body = orjson.dumps({"error": message})
    connection = b"connection: close\r\n" if close else b""
    head = b"HTTP/1.1 %d Error\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        status,
        len(body),
    )
    return head + connection + b"\r\n" + body


async def serve(model_file: Path, port: int, instances: int, host: str = "127.0.0.1") -> None:
    """Serve until SIGTERM or SIGINT."""
    runtimes = cpu_sessions(model_file, instances)
    loop = asyncio.get_running_loop()
    server = _Server(runtimes, loop)
    listener = await loop.create_server(lambda: _Connection(server), host, port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        listener.close()
        server.stop()
        for runtime in runtimes:
            runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-file", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--instances", type=int, default=1, help="sessions side by side")
    args = parser.parse_args()
    uvloop.run(serve(args.model_file, args.port, args.instances))


if __name__ == "__main__":
    main()
