"""A closed-loop HTTP/1.1 load client on raw asyncio streams that records, per answer, the
status, the latency and whether a Retry-After came with it (benchmarks/serving/loadgen.py counts
only totals). Its clients behave: after a 503 they wait the Retry-After the server asked for,
(with jitter), so what is measured is the server, not a client loop flooded with its own
retries."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field


@dataclass
class Answers:
    statuses: list[int] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    retry_after: list[bool] = field(default_factory=list)
    errors: int = 0

    def median_s(self, status: int) -> float:
        values = [t for s, t in zip(self.statuses, self.latencies_s, strict=True) if s == status]
        return statistics.median(values)

    def count(self, status: int) -> int:
        return self.statuses.count(status)


def post(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _connection(
    host: str, port: int, request: bytes, stop_at: float, answers: Answers
) -> None:
    while time.monotonic() < stop_at:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            answers.errors += 1
            continue
        try:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                writer.write(request)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=60)
                length, retry, close = 0, 0, False
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"retry-after":
                        retry = int(value)
                    elif name == b"connection" and value.strip().lower() == b"close":
                        close = True
                if length:
                    await reader.readexactly(length)
                answers.statuses.append(int(head[9:12]))
                answers.latencies_s.append(time.perf_counter() - started)
                answers.retry_after.append(retry > 0)
                if close:
                    break
                if retry:  # with jitter, as clients should, or they come back as one wave
                    pause = retry * random.uniform(1.0, 2.0)
                    await asyncio.sleep(min(pause, max(0.0, stop_at - time.monotonic())))
        except (ConnectionError, asyncio.IncompleteReadError):
            answers.errors += 1
        finally:
            writer.close()


async def load(url: str, request: bytes, concurrency: int, duration_s: float) -> Answers:
    """``concurrency`` connections sending ``request`` back to back for ``duration_s``."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    answers = Answers()
    stop_at = time.monotonic() + duration_s
    await asyncio.gather(
        *(_connection(host, int(port), request, stop_at, answers) for _ in range(concurrency))
    )
    return answers
