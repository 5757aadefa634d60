"""Simulated devices joining by zero-touch provisioning, all at once, on one event loop.

Each does what the agent does at its first start (:mod:`agent.fleet.enrol`, then
:mod:`agent.fleet.client`): post its claim to ``POST /api/v1/enrol``, honour a 429 or 503's
``Retry-After`` with the agent's jitter (and a 202's), read its broker login and the trust root
from the answer (the trust root parsed as the agent parses it), then connect to the broker with
that login under the agent's client id, subscribe to the trust root and its own topics and publish
its retained birth status (QoS 1), which counts once its PUBACK is back.

    python -m benchmarks.fleet.enrolsim --url http://127.0.0.1:8080 --token-file claim \\
        --port 1883 --count 5000

Prints one JSON line: per device the seconds from the start to its answer (``enrolled_s``) and to
its status acknowledged (``provisioned_s``), and the refusals it was asked to wait after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvloop

from agent.fleet.enrol import jittered_retry_after, retry_after_s
from benchmarks.fleet import mqttlite
from benchmarks.fleet.simdevice import PROFILE, Shared, SimDevice
from common.protocol.enrolment import ENROL_PATH, EnrolmentAnswer, EnrolmentRequest
from common.protocol.enrolment import EnrolmentStatus as Status
from common.protocol.signing import TrustRoot
from common.protocol.topics import Topics

REQUEST_TIMEOUT_S = 120.0
RECONNECT_MIN_S, RECONNECT_MAX_S = 0.5, 30.0
ENROL_RETRY_MAX_S = 300.0
LOGIN_DEADLINE_S = 600.0
"""A device still refused this long after the start counts as failed (the agent never stops)."""
"""The agent's defaults (``fleet.reconnect_min_s``, ``reconnect_max_s``, ``enrol_retry_max_s``)."""


class Answer:
    """An HTTP answer: what :func:`agent.fleet.enrol.retry_after_s` reads of httpx's."""

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code, self.headers, self.content = status_code, headers, content

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


async def post(url: str, body: bytes, headers: dict[str, str]) -> Answer:
    """One HTTP/1.1 POST on a connection of its own, as each device opens its own. (httpx's
    pool, one client for 1,000 devices, spent its time queueing and opened no connection.)"""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        head = f"POST {parts.path} HTTP/1.1\r\nhost: {parts.netloc}\r\nconnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head += f"content-length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        raw = await reader.read()
    finally:
        writer.close()
    header_bytes, _, content = raw.partition(b"\r\n\r\n")
    status_line, *lines = header_bytes.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    return Answer(int(status_line.split()[1]), fields, content)


class EnrolSim:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.token = Path(args.token_file).read_text().strip()
        self.shared = Shared(Topics(args.prefix), "mlp", {"fleet": "enrolsim"})
        self.ids = [f"{args.id_prefix}{i:05d}" for i in range(args.first, args.first + args.count)]
        self.enrolled_s: dict[str, float] = {}
        self.provisioned_s: dict[str, float] = {}
        self.waits: dict[str, int] = {}
        self.failed: dict[str, str] = {}
        self.refused_logins = 0
        self.slow_logins = 0
        """Logins not answered in mqttlite's 30 s (the broker's listen queue full while it
        reloads), tried again as the agent does after any failed connection."""
        self.devices: list[SimDevice] = []
        self.started = 0.0

    async def run(self) -> None:
        self.started = time.monotonic()
        gate = asyncio.Semaphore(self.args.http_connections)
        await asyncio.gather(*(self.one(gate, d) for d in self.ids))

    async def one(self, gate: asyncio.Semaphore, device_id: str) -> None:
        try:
            answer = await self.enrol(gate, device_id)
            self.enrolled_s[device_id] = time.monotonic() - self.started
            await self.join(device_id, answer)
            self.provisioned_s[device_id] = time.monotonic() - self.started
        except Exception as exc:  # counted and reported, as a device that did not join
            self.failed[device_id] = f"{type(exc).__name__}: {exc}"

    async def enrol(self, gate: asyncio.Semaphore, device_id: str) -> EnrolmentAnswer:
        body = (
            EnrolmentRequest(
                device_id=device_id,
                device_key=f"key-of-{device_id}-" + "k" * 32,
                hardware_profile=PROFILE,
                labels={"fleet": "enrolsim"},
                agent_version="enrolsim",
            )
            .model_dump_json()
            .encode()
        )
        headers = {"content-type": "application/json", "authorization": f"Bearer {self.token}"}
        url = self.args.url.rstrip("/") + ENROL_PATH
        delay = RECONNECT_MIN_S
        while True:
            async with gate:
                resp = await asyncio.wait_for(post(url, body, headers), REQUEST_TIMEOUT_S)
            if resp.status_code in (200, 201, 202):
                answer = EnrolmentAnswer.model_validate_json(resp.content)
                if answer.status is Status.ENROLLED:
                    return answer
                wait = answer.retry_after_s or 1.0
            elif resp.status_code in (429, 503) and (after := retry_after_s(resp)) is not None:  # type: ignore[arg-type]
                wait = jittered_retry_after(after)
            elif resp.status_code >= 500:  # as the agent: again, doubling up to its maximum
                wait = delay * random.uniform(0.8, 1.2)
                delay = min(ENROL_RETRY_MAX_S, delay * 2)
            else:
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
            key = str(resp.status_code)
            self.waits[key] = self.waits.get(key, 0) + 1
            await asyncio.sleep(wait)

    async def join(self, device_id: str, answer: EnrolmentAnswer) -> None:
        assert answer.username and answer.password and answer.trust_root is not None
        trust = TrustRoot.model_validate(answer.trust_root.get("signed", answer.trust_root))
        dev = SimDevice(device_id, self.shared, trust, 1)
        delay = RECONNECT_MIN_S
        while True:  # as the agent: a refused login is tried again, with backoff
            try:
                conn = await mqttlite.connect(
                    self.args.host,
                    self.args.port,
                    f"edgefleet-agent-{device_id}",
                    dev.on_message,
                    clean_session=False,
                    # no pings are sent here: 0 s, none expected (a 60 s keepalive unanswered
                    # had the broker drop every device 90 s after it joined)
                    keepalive_s=0,
                    will=(dev.status_topic, dev.status(online=False), 1, True),
                    login=(answer.username, answer.password),
                )
                break
            except (mqttlite.MqttLiteError, TimeoutError) as exc:
                # a password file's broker knows the device once it has reloaded; a login not
                # answered (the broker busy reloading) is tried again, as the agent does
                late = time.monotonic() - self.started > LOGIN_DEADLINE_S
                refused = "return code 5" in str(exc)
                if not (refused or isinstance(exc, TimeoutError)) or late:
                    raise
                if refused:
                    self.refused_logins += 1
                else:
                    self.slow_logins += 1
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(RECONNECT_MAX_S, delay * 2)
        dev.conn = conn
        self.devices.append(dev)
        # as the agent: the trust root first, then its own topics, then the birth
        await conn.subscribe([(self.shared.topics.trust, 1)])
        await conn.subscribe([(dev.desired_topic, 1), (dev.commands_topic, 1)])
        birth = conn.publish(
            dev.status_topic, dev.status(online=True), qos=1, retain=True, wait=True
        )
        assert birth is not None
        await asyncio.wait_for(birth, REQUEST_TIMEOUT_S)

    def report(self) -> dict[str, Any]:
        return {
            "devices": len(self.ids),
            "enrolled_s": sorted(self.enrolled_s.values()),
            "provisioned_s": sorted(self.provisioned_s.values()),
            "waits": self.waits,
            "refused_logins": self.refused_logins,
            "slow_logins": self.slow_logins,
            "failed": len(self.failed),
            "failures": dict(list(self.failed.items())[:5]),
            "cpu_s": sum(resource.getrusage(resource.RUSAGE_SELF)[:2]),
        }

    def close(self) -> None:
        for dev in self.devices:
            if dev.conn is not None:
                dev.conn.disconnect()


async def serve(args: argparse.Namespace) -> None:
    sim = EnrolSim(args)
    try:
        await sim.run()
        sys.stdout.write(json.dumps(sim.report()) + "\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # held
    finally:
        sim.close()
        await asyncio.sleep(0.2)  # let the DISCONNECTs leave


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the control plane")
    p.add_argument("--token-file", required=True, help="a file holding the claim token")
    p.add_argument("--host", default="127.0.0.1", help="the broker")
    p.add_argument("--port", type=int, required=True, help="the broker's port")
    p.add_argument("--prefix", default="edgefleet", help="topic prefix")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--id-prefix", default="zt-")
    p.add_argument("--http-connections", type=int, default=500, help="open at once, at most")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uvloop.run(serve(args))


if __name__ == "__main__":
    main()
