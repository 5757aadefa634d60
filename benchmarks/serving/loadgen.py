"""A lean HTTP/1.1 load generator on raw asyncio streams, meant to run in its own process.

httpx tops out around 400-500 requests/s per core; this client does one ``write`` and a
header scan per request, so it stays far from being the bottleneck. Closed loop: each of
``concurrency`` keep-alive connections sends the same prepared request again as soon as the
previous answer is in, for ``duration_s``. Prints one JSON document::

    python -m benchmarks.serving.loadgen --url http://127.0.0.1:8000/v2/models/cnn/infer \\
        --body body.bin --header 'Inference-Header-Content-Length: 123' -c 8 -d 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit


@dataclass
class Tally:
    latencies_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0


def build_request(url: str, body: bytes, headers: list[str]) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("the load generator only aims at http://127.0.0.1")
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {parts.hostname}",
        f"Content-Length: {len(body)}",
    ]
    if not any(h.lower().startswith("content-type:") for h in headers):
        lines.append("Content-Type: application/octet-stream")
    lines += headers
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    return parts.hostname or "127.0.0.1", parts.port or 80, head + body


async def _connection(host: str, port: int, request: bytes, stop_at: float, tally: Tally) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            tally.latencies_s.append(time.perf_counter() - started)
            tally.statuses[status] = tally.statuses.get(status, 0) + 1
    except (ConnectionError, asyncio.IncompleteReadError):
        tally.errors += 1
    finally:
        writer.close()


async def run(
    url: str, body: bytes, headers: list[str], concurrency: int, duration_s: float
) -> dict[str, object]:
    host, port, request = build_request(url, body, headers)
    tally = Tally()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    await asyncio.gather(
        *(_connection(host, port, request, started + duration_s, tally) for _ in range(concurrency))
    )
    wall = time.monotonic() - started
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    lat = sorted(tally.latencies_s)

    def pct(p: float) -> float | None:
        return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] if lat else None

    return {
        "requests": len(lat),
        "wall_s": wall,
        "requests_per_s": len(lat) / wall,
        "statuses": tally.statuses,
        "errors": tally.errors,
        "p50_s": pct(50),
        "p95_s": pct(95),
        "p99_s": pct(99),
        "client_cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="closed-loop HTTP load on 127.0.0.1")
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", type=Path, required=True, help="file holding the request body")
    parser.add_argument("--header", action="append", default=[], help="extra header, 'Name: value'")
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("-d", "--duration", type=float, default=10.0)
    args = parser.parse_args()
    work = run(args.url, args.body.read_bytes(), args.header, args.concurrency, args.duration)
    try:
        import uvloop

        result = uvloop.run(work)
    except ImportError:
        result = asyncio.run(work)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
