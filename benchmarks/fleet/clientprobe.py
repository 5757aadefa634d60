"""Why the simulator has its own MQTT client: one aiomqtt (paho) client per simulated device,
measured against the lean one, in one process, on the same broker.

    python -m benchmarks.fleet.clientprobe --port 1883 --devices 1000 3000

For each client kind and fleet size: time and CPU to connect, subscribe and publish a birth;
QoS 1 publishes per second (5 per device); idle CPU with every device connected.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiomqtt
import psutil

from benchmarks.fleet import mqttlite

PAYLOAD = b"x" * 300


def _cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


async def _measure(
    n: int,
    connect: Callable[[int], Awaitable[Any]],
    publish: Callable[[Any, int], Awaitable[None]],
    close: Callable[[Any], Awaitable[None]],
) -> dict[str, float]:
    gate = asyncio.Semaphore(200)

    async def one(i: int) -> Any:
        async with gate:
            return await connect(i)

    t0, c0 = time.monotonic(), _cpu()
    clients = await asyncio.gather(*(one(i) for i in range(n)))
    t1, c1 = time.monotonic(), _cpu()
    await asyncio.gather(*(publish(c, i) for i, c in enumerate(clients)))
    t2, c2 = time.monotonic(), _cpu()
    await asyncio.sleep(5)
    idle = (_cpu() - c2) / 5
    for c in clients:
        await close(c)
    return {
        "devices": n,
        "connect_s": round(t1 - t0, 2),
        "connect_cpu_s": round(c1 - c0, 2),
        "qos1_publishes_per_s": round(5 * n / (t2 - t1)),
        "cpu_ms_per_publish": round((c2 - c1) / (5 * n) * 1000, 3),
        "idle_cpu_cores": round(idle, 3),
    }


async def paho(n: int, port: int) -> dict[str, float]:
    async def connect(i: int) -> aiomqtt.Client:
        will = aiomqtt.Will(f"probe/devices/d{i}/status", b"off", qos=1, retain=True)
        client = aiomqtt.Client("127.0.0.1", port, identifier=f"probe-paho-{i}", will=will)
        await client.__aenter__()
        await client.subscribe([(f"probe/devices/d{i}/desired", 1)])
        await client.publish(f"probe/devices/d{i}/status", b"on", qos=1, retain=True)
        return client

    async def publish(client: aiomqtt.Client, i: int) -> None:
        for _ in range(5):
            await client.publish(f"probe/devices/d{i}/telemetry", PAYLOAD, qos=1)

    async def close(client: aiomqtt.Client) -> None:
        await client.__aexit__(None, None, None)

    return await _measure(n, connect, publish, close)


async def lean(n: int, port: int) -> dict[str, float]:
    async def connect(i: int) -> mqttlite.MqttLite:
        will = (f"probe/devices/d{i}/status", b"off", 1, True)
        conn = await mqttlite.connect("127.0.0.1", port, f"probe-lean-{i}", will=will)
        await conn.subscribe([(f"probe/devices/d{i}/desired", 1)])
        fut = conn.publish(f"probe/devices/d{i}/status", b"on", qos=1, retain=True, wait=True)
        assert fut is not None
        await fut
        return conn

    async def publish(conn: mqttlite.MqttLite, i: int) -> None:
        for _ in range(5):
            fut = conn.publish(f"probe/devices/d{i}/telemetry", PAYLOAD, qos=1, wait=True)
            assert fut is not None
            await fut

    async def close(conn: mqttlite.MqttLite) -> None:
        conn.disconnect()

    return await _measure(n, connect, publish, close)


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for n in args.devices:
        for name, probe in (("aiomqtt", paho), ("mqttlite", lean)):
            out.append({"client": name, **await probe(n, args.port)})
            print(json.dumps(out[-1]), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="aiomqtt per device against the lean client")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--devices", type=int, nargs="+", default=[1000, 3000])
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
