"""The fleet simulator: many simulated devices (:mod:`benchmarks.fleet.simdevice`) on one
event loop, one lean MQTT connection each, driven by the benchmark over stdin/stdout.

    python -m benchmarks.fleet.fleetsim --port 1883 --trust-root trust-root.json \
        --first 0 --count 5000

It prints ``{"ready": ...}`` once every device is connected, subscribed and has published its
birth, then answers one JSON line per command line:

    {"op": "stats"}                               counters, CPU and RSS of this process
    {"op": "rate", "per_s": 500, "prefix": null}  telemetry rate for the whole process
                                                  (null per_s: as fast as it can; prefix:
                                                  publish under another topic prefix)
    {"op": "marks", "state": "committed", "since": t}   monotonic times of those events
    {"op": "quit"}                                clean disconnects, then exit

Telemetry is spread round-robin over the devices at the asked rate, so each device sends one
message every count/rate seconds, as an agent with that ``telemetry_interval_s`` would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import resource
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import uvloop

from benchmarks.fleet import mqttlite
from benchmarks.fleet.simdevice import Shared, SimDevice
from common.protocol.signing import TrustRoot
from common.protocol.topics import Topics

FLOOD_BATCH = 2000
"""Messages per loop turn when publishing as fast as possible."""
MAX_BUFFER_BYTES = 256 * 1024
"""A device whose socket buffer holds more than this skips its turn (the broker is behind)."""


class FleetSim:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        doc = json.loads(Path(args.trust_root).read_bytes())
        # the provisioned file is a signed envelope, as the agent's StateFiles.load_trust reads it
        trust = TrustRoot.model_validate(doc.get("signed", doc))
        labels = dict(kv.split("=", 1) for kv in args.label)
        self.shared = Shared(Topics(args.prefix), args.model, labels, args.telemetry_interval_s)
        ids = [f"{args.id_prefix}{i:05d}" for i in range(args.first, args.first + args.count)]
        self.devices = [SimDevice(d, self.shared, trust, args.version) for d in ids]
        self.rate_per_s: float | None = 0.0
        self.rate_prefix: str | None = None
        self._rate_changed = asyncio.Event()
        self.sent: dict[str, int] = {}
        self.skipped = 0
        self.lost = 0
        self.quitting = False

    async def connect(self) -> float:
        started = time.monotonic()
        gate = asyncio.Semaphore(self.args.connect_concurrency)
        trust_topic = self.shared.topics.trust

        async def one(dev: SimDevice) -> None:
            async with gate:
                conn = await mqttlite.connect(
                    self.args.host,
                    self.args.port,
                    f"edgefleet-agent-{dev.device_id}",
                    dev.on_message,
                    keepalive_s=self.args.keepalive_s,
                    clean_session=False,
                    will=(dev.status_topic, dev.status(online=False), 1, True),
                )
                dev.conn = conn
                conn.closed.add_done_callback(self._closed)
                # the trust root first, as the agent does, then its own topics, then the birth
                await conn.subscribe([(trust_topic, 1)])
                await conn.subscribe([(dev.desired_topic, 1), (dev.commands_topic, 1)])
                dev.publish_status()

        await asyncio.gather(*(one(d) for d in self.devices))
        return time.monotonic() - started

    def _closed(self, _: object) -> None:
        if not self.quitting:
            self.lost += 1

    def set_rate(self, per_s: float | None, prefix: str | None) -> None:
        self.rate_per_s, self.rate_prefix = per_s, prefix
        self._rate_changed.set()

    async def pace(self) -> None:
        """Publish telemetry at ``rate_per_s`` (None: flood), round-robin over devices."""
        i, n = 0, len(self.devices)
        while True:
            self._rate_changed.clear()
            rate, prefix = self.rate_per_s, self.rate_prefix
            key = prefix or self.args.prefix
            if rate is not None and rate <= 0:
                await self._rate_changed.wait()
                continue
            started, sent = time.monotonic(), 0
            while not self._rate_changed.is_set():
                if rate is None:
                    due = FLOOD_BATCH
                else:
                    due = min(FLOOD_BATCH, math.floor((time.monotonic() - started) * rate) - sent)
                if due > 0:
                    now_iso = datetime.now(UTC).isoformat()
                    for _ in range(due):
                        dev = self.devices[i]
                        i = (i + 1) % n
                        assert dev.conn is not None
                        if dev.conn.write_buffer_bytes > MAX_BUFFER_BYTES:
                            self.skipped += 1
                            continue
                        topic = f"{prefix}/devices/{dev.device_id}/telemetry" if prefix else None
                        dev.telemetry(now_iso, topic)
                        self.sent[key] = self.sent.get(key, 0) + 1
                    sent += due
                await asyncio.sleep(0 if rate is None or due >= FLOOD_BATCH else 0.005)

    async def keepalive(self) -> None:
        while True:
            await asyncio.sleep(self.args.keepalive_s / 2)
            for dev in self.devices:
                if dev.conn is not None:
                    dev.conn.ping()

    def stats(self) -> dict[str, Any]:
        proc = psutil.Process()
        cpu = proc.cpu_times()
        conns = [d.conn for d in self.devices if d.conn is not None]
        return {
            "devices": len(self.devices),
            "connected": len(conns) - self.lost,
            "lost": self.lost,
            "sent": dict(self.sent),
            "skipped": self.skipped,
            "acked": sum(c.acked for c in conns),
            "received": sum(c.received for c in conns),
            "events_sent": self.shared.events_sent,
            "rejected": dict(self.shared.rejected),
            "marks": {k: len(v) for k, v in self.shared.marks.items()},
            "versions": _histogram(d.committed_version for d in self.devices),
            "cpu_s": cpu.user + cpu.system,
            "rss_bytes": proc.memory_info().rss,
            "t": time.monotonic(),
        }

    def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd.get("op")
        if op == "stats":
            return self.stats()
        if op == "rate":
            self.set_rate(cmd.get("per_s"), cmd.get("prefix"))
            return {"ok": True, "t": time.monotonic(), "sent": dict(self.sent)}
        if op == "marks":
            since = float(cmd.get("since", 0.0))
            times = self.shared.marks.get(str(cmd.get("state")), [])
            return {"times": [t for t in times if t >= since]}
        return {"error": f"unknown op {op!r}: stats, rate, marks or quit"}

    def close(self) -> None:
        self.quitting = True
        for dev in self.devices:
            if dev.conn is not None:
                dev.conn.disconnect()


def _histogram(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def _say(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


async def serve(args: argparse.Namespace) -> None:
    sim = FleetSim(args)
    connect_s = await sim.connect()
    sim.set_rate(len(sim.devices) / args.telemetry_interval_s, None)
    _say({"ready": True, "connect_s": connect_s, "devices": len(sim.devices)})
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with asyncio.TaskGroup() as tg:
        pacer = tg.create_task(sim.pace(), name="sim:telemetry")
        pinger = tg.create_task(sim.keepalive(), name="sim:keepalive")
        try:
            while line := await reader.readline():
                cmd = json.loads(line)
                if cmd.get("op") == "quit":
                    break
                _say(sim.handle(cmd))
        finally:
            pacer.cancel()
            pinger.cancel()
            sim.close()
            await asyncio.sleep(0.5)  # let the DISCONNECTs leave
            _say({"bye": True, **sim.stats()})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--trust-root", required=True, help="the control plane's trust-root.json")
    p.add_argument("--prefix", default="edgefleet", help="topic prefix")
    p.add_argument("--first", type=int, default=0, help="index of the first device")
    p.add_argument("--count", type=int, default=100, help="devices in this process")
    p.add_argument("--id-prefix", default="sim-")
    p.add_argument("--model", default="mlp")
    p.add_argument("--version", type=int, default=1, help="the version every device serves")
    p.add_argument("--label", action="append", default=["fleet=sim"], help="key=value")
    p.add_argument("--keepalive-s", type=int, default=60)
    p.add_argument("--telemetry-interval-s", type=float, default=10.0)
    p.add_argument("--connect-concurrency", type=int, default=256)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uvloop.run(serve(args))


if __name__ == "__main__":
    main()
