"""The bare subscriber: what Mosquitto delivers to a client that only counts messages.

    python -m benchmarks.fleet.baresub --port 1883 --filter 'bare/devices/+/telemetry'

Prints ``{"ready": true}`` once subscribed (QoS 1, as the control plane subscribes), then
answers each line on stdin (``count``) with ``{"received": n, "t": monotonic}``; ``quit`` ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import uvloop

from benchmarks.fleet import mqttlite


async def serve(args: argparse.Namespace) -> None:
    conn = await mqttlite.connect(args.host, args.port, args.client_id, keepalive_s=0)
    await conn.subscribe([(args.filter, 1)])
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        if line.strip() == b"quit":
            break
        sys.stdout.write(json.dumps({"received": conn.received, "t": time.monotonic()}) + "\n")
        sys.stdout.flush()
    conn.disconnect()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Count what the broker delivers.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--filter", required=True)
    p.add_argument("--client-id", default="edgefleet-bench-bare")
    uvloop.run(serve(p.parse_args(argv)))


if __name__ == "__main__":
    main()
