"""The brokers the replica tests start as the docs set them up: from the files ``edgefleet
fleet init`` wrote (password file accounts), and from those ``fleet dynsec-config`` wrote
(dynamic security accounts)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from tests.access.mqtt_client import ProbeClient
from tests.agent.server import wait_until
from tests.agent.test_cli import edgefleet
from tests.control_plane.enrolment.conftest import write_dynsec_broker
from tests.mqtt_broker import free_port


@contextlib.contextmanager
def broker_from(conf: Path, log: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with log.open("wb") as out:
        proc = subprocess.Popen([exe, "-c", str(conf)], stdout=out, stderr=out)
    try:
        wait_until(lambda: _accepts(port) or proc.poll() is not None, what="the broker")
        assert proc.poll() is None, log.read_text()
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _accepts(port: int) -> bool:
    probe = ProbeClient(port)  # any answer (refused or not) means the port is up
    try:
        return probe.connect() is not None
    except OSError:
        return False
    finally:
        probe.close()


@dataclass
class FleetBroker:
    """A broker as the docs set it up: where devices and replicas log in, the replicas'
    broker settings, and a restart that keeps its accounts and forgets every session,
    subscription and retained message."""

    device_url: str
    replica_url: str
    replica_env: dict[str, str]
    workdir: Path
    state_dir: Path
    """The control plane's (keys, broker passwords), shared by the replicas."""
    restart_forgetting: Callable[[], None]
    log: Callable[[], str]
    device_port: int
    printed: str = ""
    """What ``fleet init`` printed (its dashboard line), if the broker is its."""


@contextlib.contextmanager
def fleet_init_broker(root: Path, db_url: str) -> Iterator[FleetBroker]:
    """``edgefleet fleet init ROOT/fleet`` on free ports, and its broker started from the
    files it wrote (its output in ``ROOT/broker-<n>.log``, a file per start)."""
    fleet, device_port, cp_port = root / "fleet", free_port(), free_port()
    args = ["--mqtt-port", str(device_port), "--control-plane-port", str(cp_port)]
    done = edgefleet("fleet", "init", str(fleet), *args, "--db", db_url)
    settings = tomllib.loads((fleet / "control-plane.toml").read_text())
    conf, logs = fleet / "broker" / "mosquitto.conf", [root / "broker-1.log"]
    with ExitStack() as stack:
        procs = [stack.enter_context(broker_from(conf, logs[0], device_port))]

        def restart() -> None:
            procs[-1].send_signal(signal.SIGKILL)
            procs[-1].wait(timeout=20)
            for saved in (fleet / "broker" / "data").glob("mosquitto.db*"):
                saved.unlink()  # autosave_interval 60: none yet; made sure of
            logs.append(root / f"broker-{len(logs) + 1}.log")
            procs.append(stack.enter_context(broker_from(conf, logs[-1], device_port)))

        yield FleetBroker(
            device_url=f"mqtt://127.0.0.1:{device_port}",
            replica_url=settings["mqtt_url"],
            replica_env={
                "EDGEFLEET_CP_MQTT_USERNAME": settings["mqtt_username"],
                "EDGEFLEET_CP_MQTT_PASSWORD_FILE": settings["mqtt_password_file"],
            },
            workdir=root,
            state_dir=fleet / "control-plane",
            restart_forgetting=restart,
            log=lambda: "".join(p.read_text(errors="replace") for p in logs),
            device_port=device_port,
            printed=done.stdout,
        )


@contextlib.contextmanager
def dynsec_broker(root: Path) -> Iterator[FleetBroker]:
    """The broker ``fleet dynsec-config`` writes (ROOT/broker), run from its files unchanged."""
    state = root / "control-plane"
    broker = write_dynsec_broker(root / "broker", state).start()

    def restart() -> None:
        broker.stop(kill=True)
        for saved in (broker.workdir / "data").glob("mosquitto.db*"):
            saved.unlink()  # the accounts live in the plugin's file, which stays
        broker.start()

    try:
        yield FleetBroker(
            device_url=broker.url,
            replica_url=broker.control_plane_url,
            replica_env={
                "EDGEFLEET_CP_MQTT_USERNAME": "edgefleet-control-plane",
                "EDGEFLEET_CP_MQTT_PASSWORD_FILE": str(
                    state / "mqtt" / "edgefleet-control-plane.password"
                ),
                "EDGEFLEET_CP_ENROLMENT__ACCOUNTS": "dynsec",
            },
            workdir=root,
            state_dir=state,
            restart_forgetting=restart,
            log=broker.log,
            device_port=broker.port,
        )
    finally:
        broker.stop()
