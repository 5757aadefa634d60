"""Issue 47's scenario end to end, on the brokers we ship: the broker from the files ``fleet
init`` wrote (password file) or from ``fleet dynsec-config`` (the plugin), two control plane
replicas on PostgreSQL sharing it, three real agents enrolling by claim at the same instant
(through both replicas), the broker SIGKILLed and started again with its state gone (as one
without persistence) in the agents' first seconds, a rollout, and its leader SIGKILLed while
wave 1 bakes. It shows: the replicas healthy throughout (but while the broker was away), every
device enrolled and online, every telemetry seq 1..N stored exactly once, the rollout finished
on the survivor; and on ``fleet init``'s broker, the quickstart's dashboard line, run verbatim,
reads telemetry with no session taken over in either replica's log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx
import pytest

from agent.fleet.settings import FleetSettings
from runtimes.examples.variants import mlp_version
from tests.agent.process import AgentProcess, agent_process
from tests.agent.server import copy_models, wait_until
from tests.control_plane.enrolment.conftest import postgresql_database
from tests.control_plane.leadership.brokers import FleetBroker, dynsec_broker, fleet_init_broker
from tests.control_plane.leadership.processes import (
    Replica,
    agent_config,
    every_seq_stored_once,
    leader,
    outbox,
)
from tests.control_plane.leadership.test_fleet_brokers import (
    claim,
    stay_healthy,
    two_replicas,
)
from tests.control_plane.leadership.test_leader_kill import served
from tests.control_plane.test_rollouts import push, validate, wait_devices
from tests.test_quickstart import page_blocks

pytestmark = pytest.mark.slow

DEVICES = ("dev-1", "dev-2", "dev-3")
TAKEOVERS = ("already connected", "session taken over")
"""What the broker, and a replica, log when a session is taken over."""


@dataclass
class HealthWatch:
    """Every live replica's ``/health`` about every 0.2 s from a thread: (when asked, when
    answered, replica, 200 with mqtt true) for each look."""

    replicas: tuple[Replica, ...]
    looks: list[tuple[float, float, str, bool]] = field(default_factory=list)
    said: dict[float, str] = field(default_factory=dict)
    """What an unhealthy look got, by when it asked."""

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._gone: set[str] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(0.2):
                for r in self.replicas:
                    if r.name in self._gone:
                        continue
                    asked = time.monotonic()
                    try:
                        resp = client.get(f"{r.url}/health")
                        ok = resp.status_code == 200 and resp.json()["mqtt"] is True
                        said = f"{resp.status_code} {resp.text}"
                    except httpx.HTTPError as exc:
                        ok, said = False, repr(exc)
                    if r.name in self._gone:
                        continue  # killed while it asked
                    self.looks.append((asked, time.monotonic(), r.name, ok))
                    if not ok:
                        self.said[asked] = said

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def kill(self, r: Replica) -> None:
        """SIGKILL a replica, watched no more from now."""
        self._gone.add(r.name)
        r.proc.send_signal(signal.SIGKILL)
        r.proc.wait(timeout=30)

    def unhealthy(self, name: str) -> list[tuple[float, float]]:
        return [(t, u) for t, u, n, ok in self.looks if n == name and not ok]

    def looked(self, name: str, since: float) -> int:
        return sum(1 for t, _, n, _ in self.looks if n == name and t >= since)


def agents_at_once(stack: ExitStack, configs: list[Path]) -> list[AgentProcess]:
    """Every agent's process started at the same moment, each enrolling as it starts."""
    with ThreadPoolExecutor(len(configs)) as pool:
        started = pool.map(
            lambda c: stack.enter_context(agent_process("--config", str(c))), configs
        )
        return list(started)


def claimed_agents(
    stack: ExitStack,
    tmp_path: Path,
    example_repo: Path,
    broker: FleetBroker,
    token: str,
    urls: list[str],
) -> dict[str, AgentProcess]:
    """Agents with nothing but a claim token and a replica's URL (each its own, in turn)."""
    token_file = tmp_path / "claim"
    token_file.write_text(token)
    configs = []
    for i, device_id in enumerate(DEVICES):
        fleet = FleetSettings(
            mqtt_url=broker.device_url,
            device_id=device_id,
            labels={"site": "lab"},
            state_dir=tmp_path / f"state-{device_id}",
            enrol_url=urls[i % len(urls)],
            claim_token_file=token_file,
            enrol_retry_max_s=2.0,
            telemetry_interval_s=0.1,
            reconnect_min_s=0.05,
            reconnect_max_s=0.5,
        )
        repo = copy_models(example_repo, tmp_path / f"repo-{device_id}", "mlp")
        configs.append(agent_config(tmp_path / f"{device_id}.toml", repo, fleet))
    return dict(zip(DEVICES, agents_at_once(stack, configs), strict=True))


def restart_in_the_first_seconds(
    broker: FleetBroker,
    agents: dict[str, AgentProcess],
    tmp_path: Path,
    replicas: tuple[Replica, ...],
) -> tuple[float, float, dict[str, int]]:
    """As soon as every agent is connected and has sent telemetry, the broker killed and
    started again with nothing kept: returns when it was killed, when every replica was
    healthy again, and how many telemetry messages each agent had produced by then."""

    def sent() -> bool:
        connected = all("connected to the broker" in x.log_messages() for x in agents.values())
        return connected and all(outbox(tmp_path / f"state-{d}")[0] >= 3 for d in agents)

    wait_until(sent, timeout_s=90, what="every agent enrolled, connected and sending")
    produced = {d: outbox(tmp_path / f"state-{d}")[0] for d in agents}
    killed = time.monotonic()
    broker.restart_forgetting()
    # within the agents' first 3 s: 30 telemetry intervals of 0.1 s
    assert max(produced.values()) <= 30, produced
    stay_healthy(replicas, seconds=1.0)
    return killed, time.monotonic(), produced


def every_device_enrolled_and_online(cp: Replica) -> None:
    wait_devices(cp, *DEVICES)
    states = {e["device_id"]: e["state"] for e in cp.admin.get("/api/v1/enrolments").json()}
    assert states == dict.fromkeys(DEVICES, "enrolled"), states


def the_dashboard_line_reads_telemetry(broker: FleetBroker) -> None:
    """docs/quickstart-fleet.md's ``mosquitto_sub`` line, verbatim, in the directory holding
    ``fleet/``: two devices' telemetry messages, and it stops (``-C 2``)."""
    line = next(b for b in page_blocks() if "mosquitto_sub" in b).strip()
    env = {**os.environ, "EF_MQTT_PORT": str(broker.device_port)}
    done = subprocess.run(
        ["bash", "-c", line],
        cwd=broker.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    got = [
        x for x in done.stdout.splitlines() if re.match(r"edgefleet/devices/dev-\d/telemetry ", x)
    ]
    assert len(got) == 2, done.stdout[-2000:]


def rollout_with_its_leader_killed(
    watch: HealthWatch, db_url: str, agents: dict[str, AgentProcess], tmp_path: Path
) -> tuple[Replica, Replica, float]:
    """A two-wave rollout created through the follower; the leader SIGKILLed once wave 1
    committed, while it bakes; the survivor leads and finishes it. Returns (the killed, the
    survivor, when it was killed)."""
    a, b = watch.replicas
    wait_until(lambda: leader(db_url) is not None, what="a leader")
    killed, survivor = (a, b) if str(leader(db_url)).startswith("edgefleet-cp-a:") else (b, a)
    push(survivor.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
    assert validate(survivor.admin, "mlp", 2)["passed"]
    spec = {
        "model": "mlp",
        "version": 2,
        "selector": {"site": "lab"},
        "waves": ["1", "100%"],
        "bake_time_s": 3,  # the kill lands in it
        "device_timeout_s": 60,
        "gates": {"allow_unjudged": True},  # no traffic here
    }
    resp = survivor.admin.post("/api/v1/rollouts", json=spec)
    assert resp.status_code == 201, resp.text
    url = f"/api/v1/rollouts/{resp.json()['id']}"
    wait_until(lambda: "2" in [served(x) for x in agents.values()], timeout_s=60, what="wave 1")
    at = time.monotonic()
    watch.kill(killed)
    assert survivor.admin.get(url).json()["state"] == "running"  # mid-rollout
    assert sorted(served(x) for x in agents.values()) == ["1", "1", "2"]
    wait_until(
        lambda: str(leader(db_url)).startswith(f"edgefleet-{survivor.name}:"),
        timeout_s=30,
        what="the survivor to lead",
    )
    wait_until(
        lambda: survivor.admin.get(url).json()["state"] != "running",
        timeout_s=90,
        what="the survivor to finish the rollout",
    )
    doc = survivor.admin.get(url).json()
    assert doc["state"] == "succeeded", (doc.get("reason"), doc.get("devices"), doc.get("waves"))
    assert [served(x) for x in agents.values()] == ["2", "2", "2"]
    return killed, survivor, at


@pytest.fixture
def db_url() -> Iterator[str]:
    with postgresql_database() as url:
        yield url


@pytest.fixture(params=["fleet-init", "dynsec"])
def fleet_broker(
    request: pytest.FixtureRequest, open_dir: Path, db_url: str
) -> Iterator[FleetBroker]:
    kind = (
        fleet_init_broker(open_dir, db_url)
        if request.param == "fleet-init"
        else dynsec_broker(open_dir)
    )
    with kind as broker:
        yield broker


def test_replicas_hold_a_fleet_enrolling_at_once_through_a_broker_restart_and_a_leader_kill(
    fleet_broker: FleetBroker, db_url: str, example_repo: Path, tmp_path: Path
) -> None:
    broker = fleet_broker
    with ExitStack() as stack:
        replicas = stack.enter_context(
            two_replicas(broker.state_dir, db_url, broker.replica_url, broker.replica_env)
        )
        watch = stack.enter_context(HealthWatch(replicas))
        a, b = replicas
        urls = [a.url, b.url]
        agents = claimed_agents(stack, tmp_path, example_repo, broker, claim(a), urls)
        broker_killed, recovered, produced = restart_in_the_first_seconds(
            broker, agents, tmp_path, replicas
        )
        every_device_enrolled_and_online(b)
        if broker.printed:  # fleet init's broker has the dashboard account
            the_dashboard_line_reads_telemetry(broker)
        killed, survivor, killed_at = rollout_with_its_leader_killed(
            watch, db_url, agents, tmp_path
        )
        marks = every_seq_stored_once(db_url, {d: tmp_path / f"state-{d}" for d in DEVICES})
        every_device_enrolled_and_online(survivor)
        stay_healthy((survivor,), seconds=1.0)
    assert min(marks.values()) > max(produced.values()), (marks, produced)
    # healthy throughout, but while the broker was away (the killed replica until its kill)
    for r in (killed, survivor):
        away = [
            (round(asked - broker_killed, 1), watch.said[asked])
            for asked, answered in watch.unhealthy(r.name)
            if answered < broker_killed or asked >= recovered
        ]
        assert not away, (r.name, away)
    assert watch.looked(survivor.name, since=killed_at) > 0
    for text in (a.log.read_text(), b.log.read_text(), broker.log()):
        assert not any(x in text for x in TAKEOVERS), [x for x in TAKEOVERS if x in text]
