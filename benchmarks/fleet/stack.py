"""The processes a fleet benchmark runs: Mosquitto, the control plane, simulator processes and
the bare subscriber, each a real process on 127.0.0.1, stopped by the ``ExitStack`` that
started it."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx
import tomli_w

from runtimes.examples.variants import mlp_version

MODEL = "mlp"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = check()
        except (httpx.HTTPError, OSError):
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def _raise_nofile() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@contextmanager
def process(
    args: list[str],
    log: Path,
    *,
    stdin: bool = False,
    stdout: bool = False,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process with ``ulimit -n`` raised to the hard limit; SIGTERM, then SIGKILL.
    ``env`` is added to this process's environment."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout else out,
            stderr=out,
            preexec_fn=_raise_nofile,
            env={**os.environ, **env} if env else None,
        )
        try:
            yield proc
        finally:
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def mosquitto_config(port: int, workdir: Path) -> str:
    # Started as root, mosquitto would drop to the "mosquitto" user: keep the user we are.
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name}\n" if os.geteuid() == 0 else ""
    return (
        user + f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        # In memory only: retained messages and sessions live as long as this broker, which
        # is all a benchmark run needs (no disk writes competing with SQLite).
        "persistence false\n"
        # QoS 1 messages in flight per client: the control plane's one subscription carries
        # the whole fleet's telemetry, 20 (the default) caps it at one round trip per 20.
        # Twice the control plane's batch: one batch being written does not hold all of it.
        "max_inflight_messages 40000\n"
        # What waits for a slow subscriber before the broker drops it (default 1000): the
        # benchmark counts losses itself and wants the control plane to be the limit.
        "max_queued_messages 1000000\n"
        "set_tcp_nodelay true\n"
        f"log_dest file {workdir}/mosquitto.log\nlog_type error\nlog_type warning\n"
    )


def mosquitto_args(workdir: Path, port: int) -> list[str]:
    config = workdir / "mosquitto.conf"
    config.write_text(mosquitto_config(port, workdir))
    return [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(config)]


def port_open(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def control_plane_config(
    workdir: Path,
    mqtt_port: int,
    port: int,
    *,
    db_url: str | None = None,
    replica: int | None = None,
) -> Path:
    """The control plane's settings; with ``replica`` (0, 1, ...), one of several replicas on
    ``db_url`` (PostgreSQL): its own broker client id in one shared subscription group, the
    state directory shared."""
    state = workdir / "control-plane"
    path = workdir / ("control-plane.toml" if replica is None else f"control-plane-{replica}.toml")
    replicas: dict[str, Any] = {}
    if replica is not None:
        replicas = {"mqtt_client_id": f"bench-cp-{replica}", "mqtt_shared_group": "bench"}
    path.write_text(
        tomli_w.dumps(
            {
                **replicas,
                "db_url": db_url or f"sqlite+aiosqlite:///{state}/edgefleet.db",
                "mqtt_url": f"mqtt://127.0.0.1:{mqtt_port}",
                "port": port,
                "state_dir": str(state),
                "artifact_dir": str(state / "artifacts"),
                "log_level": "WARNING",
                # as the broker's max_inflight_messages, twice the batch: with a window equal
                # to it, a batch being written held the whole window and the broker queued the
                # fleet behind it (at 5,000 devices 15,800-18,600 msg/s stored losslessly, with
                # twice 23,300 in two runs). Batches of up to 20,000 messages, a second of
                # telemetry at the rates measured (ingest_telemetry_delay_s), dirty each index
                # page for several rows
                "mqtt_broker_inflight": 40000,
                "ingest_batch_size": 20000,
            }
        )
    )
    return path


def admin_client(workdir: Path, port: int) -> httpx.Client:
    token = (workdir / "control-plane" / "admin-token").read_text().strip()
    return httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=300,
    )


def push_version(api: httpx.Client, workdir: Path, version: int) -> None:
    """Register, upload and validate a real model version (the control plane runs it).
    Health window 0 s: simulated devices run no inference to watch."""
    directory = mlp_version(workdir / f"v{version}", seed=version)
    spec = {
        "version": version,
        "variants": [{"format": "onnx", "profiles": []}],
        "health": {"window_s": 0.0, "self_test": False},
    }
    api.post(f"/api/v1/models/{MODEL}/versions", json=spec).raise_for_status()
    api.put(
        f"/api/v1/models/{MODEL}/versions/{version}/variants/0/files/model.onnx",
        content=(directory / "model.onnx").read_bytes(),
    ).raise_for_status()
    api.put(
        f"/api/v1/models/{MODEL}/versions/{version}/golden",
        content=(directory / "golden.npz").read_bytes(),
    ).raise_for_status()
    report = api.post(f"/api/v1/models/{MODEL}/versions/{version}/validate").json()
    if not report.get("passed"):
        raise RuntimeError(f"{MODEL} v{version} failed validation: {report}")


class LineChild:
    """A child process spoken to in JSON lines (the simulator, the bare subscriber)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        self._in: IO[bytes] = proc.stdin
        self._out: IO[bytes] = proc.stdout

    def read(self) -> dict[str, Any]:
        line = self._out.readline()
        if not line:
            raise RuntimeError(f"child {self.proc.args!r} exited ({self.proc.poll()})")
        return json.loads(line)  # type: ignore[no-any-return]

    def send(self, line: str) -> None:
        self._in.write(line.encode() + b"\n")
        self._in.flush()

    def ask(self, cmd: dict[str, Any] | str) -> dict[str, Any]:
        self.send(cmd if isinstance(cmd, str) else json.dumps(cmd))
        return self.read()


def sim_args(
    mqtt_port: int, trust_root: Path, first: int, count: int, interval_s: float
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "benchmarks.fleet.fleetsim",
        "--port",
        str(mqtt_port),
        "--trust-root",
        str(trust_root),
        "--first",
        str(first),
        "--count",
        str(count),
        "--telemetry-interval-s",
        str(interval_s),
    ]


class Database:
    """Read-only counts straight from the control plane's SQLite file (cheaper than polling
    the API for thousands of devices; SQLite's WAL lets a reader look while it writes)."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)

    def scalar(self, sql: str, *params: Any) -> int:
        return int(self.conn.execute(sql, params).fetchone()[0] or 0)

    def rollout_states(self, rollout_id: int) -> dict[str, int]:
        rows = self.conn.execute(
            "SELECT state, count(*) FROM rollout_devices WHERE rollout_id = ? GROUP BY state",
            (rollout_id,),
        ).fetchall()
        return {state: int(n) for state, n in rows}

    def rollout_state(self, rollout_id: int) -> str:
        row = self.conn.execute("SELECT state FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        return str(row[0]) if row else ""

    def close(self) -> None:
        self.conn.close()


class PgDatabase(Database):
    """The same counts from the control plane's PostgreSQL database (``?`` placeholders
    become psycopg's ``%s``)."""

    def __init__(self, db_url: str) -> None:  # no SQLite file: not Database.__init__
        import psycopg  # the benchmark's PostgreSQL runs only

        url = db_url.replace("postgresql+psycopg://", "postgresql://")
        self.pg = psycopg.connect(url, autocommit=True)

    def scalar(self, sql: str, *params: Any) -> int:
        row = self.pg.execute(sql.replace("?", "%s"), params).fetchone()
        return int((row[0] if row else 0) or 0)

    def rollout_states(self, rollout_id: int) -> dict[str, int]:
        rows = self.pg.execute(
            "SELECT state, count(*) FROM rollout_devices WHERE rollout_id = %s GROUP BY state",
            (rollout_id,),
        ).fetchall()
        return {state: int(n) for state, n in rows}

    def rollout_state(self, rollout_id: int) -> str:
        row = self.pg.execute("SELECT state FROM rollouts WHERE id = %s", (rollout_id,)).fetchone()
        return str(row[0]) if row else ""

    def close(self) -> None:
        self.pg.close()
