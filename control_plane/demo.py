"""The single-machine demo: the whole story, with real processes.

A broker, the control plane and two agents of different hardware profiles start as separate
processes; a new model version is pushed, validated and rolled out in waves (each device gets its
own artifact) and answers inference; a generative model (``tiny-lm``) is rolled out with gates on
its token latencies and completes a prompt on each device; then a version that breaks on live
traffic is rolled out and rolled back automatically by the health gate.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tomli_w

from control_plane.db.states import FINISHED, RolloutState
from control_plane.demo_generative import roll_out_generative
from control_plane.provisioning.acl import CONTROL_PLANE_USER
from control_plane.provisioning.mosquitto import FleetAccess
from runtimes.examples import write_example_repository
from runtimes.examples.variants import fragile_mlp_version, mlp_tflite_version, mlp_version

Echo = Callable[[str], None]
DEVICES = {
    "edge-x86": ("auto", {"site": "demo", "kind": "x86"}),
    "edge-pi": ("raspberry-pi-5", {"site": "demo", "kind": "pi"}),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def _ready(url: str) -> bool:
    return httpx.get(f"{url}/v2/health/ready").status_code == 200


def _wait(what: str, check: Callable[[], Any], timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = check()
        except (httpx.HTTPError, OSError):
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


@contextmanager
def _process(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _infer(url: str, x: np.ndarray) -> httpx.Response:
    body = {
        "inputs": [
            {
                "name": "input",
                "shape": list(x.shape),
                "datatype": "FP32",
                "data": x.ravel().tolist(),
            }
        ]
    }
    return httpx.post(f"{url}/v2/models/mlp/infer", json=body, timeout=30)


def _self_test_locally(exe: str, workdir: Path, echo: Echo) -> int:
    """The example models placed and self-tested on this machine, by the agent's own command
    in a process of its own (the control plane loads no serving code of the agent)."""
    repository = workdir / "models"
    echo(f"== writing the example model repository to {repository}")
    write_example_repository(repository, overwrite=True, log=echo)
    command = [exe, "models", "selftest", str(repository), "--cache-dir", str(workdir / "cache")]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as check:
        assert check.stdout is not None
        for line in check.stdout:
            echo(line.rstrip("\n"))
    return check.returncode


def run_demo(
    workdir: Path, echo: Echo, mqtt_url: str | None = None, log_level: str = "INFO"
) -> int:
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    logs = workdir / "logs"
    logs.mkdir()
    exe = str(Path(sys.executable).parent / "edgefleet")
    if _self_test_locally(exe, workdir / "local", echo):
        return 1
    with ExitStack() as stack:
        echo(f"== starting a broker, the control plane and two agents (logs in {logs})")
        cp_state = workdir / "control-plane"
        credentials: dict[str, dict[str, str]] = {}
        cp_mqtt_url = mqtt_url
        if mqtt_url is None:
            mqtt_url, cp_mqtt_url, credentials = _start_broker(stack, workdir, cp_state, log_level)
        cp_port = _free_port()
        cp_config = workdir / "control-plane.toml"
        cp_config.write_text(
            tomli_w.dumps(
                {
                    "db_url": f"sqlite+aiosqlite:///{cp_state}/edgefleet.db",
                    "mqtt_url": cp_mqtt_url,
                    "port": cp_port,
                    "state_dir": str(cp_state),
                    "artifact_dir": str(cp_state / "artifacts"),
                    "rollout_tick_s": 0.5,
                    "log_level": log_level,
                    **credentials.get(CONTROL_PLANE_USER, {}),
                }
            )
        )
        stack.enter_context(
            _process([exe, "control-plane", "--config", str(cp_config)], logs / "control-plane.log")
        )
        cp_url = f"http://127.0.0.1:{cp_port}"
        _wait("the control plane", lambda: httpx.get(f"{cp_url}/health").status_code == 200)
        token = (cp_state / "admin-token").read_text().strip()
        api = stack.enter_context(
            httpx.Client(base_url=cp_url, headers={"Authorization": f"Bearer {token}"}, timeout=300)
        )
        agents: dict[str, str] = {}
        for device_id, (profile, labels) in DEVICES.items():
            repo = workdir / device_id / "models"
            write_example_repository(repo, models=("mlp",))
            port = _free_port()
            config = workdir / device_id / "agent.toml"
            config.write_text(
                tomli_w.dumps(
                    {
                        "model_repository": str(repo),
                        "port": port,
                        "profile": profile,
                        "access_log": False,
                        "log_level": log_level,
                        "fleet": {
                            **credentials.get(device_id, {}),
                            "mqtt_url": mqtt_url,
                            "device_id": device_id,
                            "labels": labels,
                            "state_dir": str(workdir / device_id / "state"),
                            "trust_root_file": str(cp_state / "trust-root.json"),
                            "telemetry_interval_s": 1.0,
                        },
                    }
                )
            )
            stack.enter_context(
                _process([exe, "agent", "--config", str(config)], logs / f"{device_id}.log")
            )
            agents[device_id] = f"http://127.0.0.1:{port}"
        for device_id, url in agents.items():
            _wait(f"agent {device_id}", functools.partial(_ready, url))
        _wait(
            "both devices in the inventory",
            lambda: (
                {d["id"] for d in api.get("/api/v1/devices").json() if d["online"]} >= set(DEVICES)
            ),
        )
        for d in api.get("/api/v1/devices").json():
            echo(
                f"device {d['id']}: profile {d['hardware_profile']}, serving "
                + ", ".join(f"{m['model']} v{m['version']}" for m in d["models"])
            )
        x = np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)

        echo("== version 2: an ONNX artifact for x86 boxes, a TFLite one for Raspberry Pis")
        v2_onnx = mlp_version(workdir / "v2" / "onnx", seed=2)
        v2_tflite = mlp_tflite_version(workdir / "v2" / "tflite", seed=2)
        _push(
            api,
            2,
            [
                (v2_onnx, "onnx", ["generic-x86_64", "nvidia-gpu"]),
                (v2_tflite, "tflite", ["raspberry-pi-5"]),
            ],
        )
        _validate(api, 2, echo)
        rollout = _rollout(api, 2, echo)

        def traffic() -> None:  # what the devices' apps would send
            for url in agents.values():
                for _ in range(5):
                    _infer(url, x)

        doc = _follow(api, rollout, echo, traffic)
        if doc["state"] != RolloutState.SUCCEEDED:
            echo(f"rollout {rollout} did not succeed: {doc['reason']}")
            return 1
        for device_id, url in agents.items():
            resp = _infer(url, x).json()
            platform = httpx.get(f"{url}/v2/models/mlp").json()["platform"]
            echo(
                f"{device_id}: v{resp['model_version']} on {platform}, logits[:3] = "
                f"{np.round(resp['outputs'][0]['data'][:3], 4).tolist()}"
            )

        if not roll_out_generative(api, agents, workdir / "generative", echo, _follow):
            return 1

        echo("== version 3: passes validation, but fails on some live traffic")
        _push(api, 3, [(fragile_mlp_version(workdir / "v3", seed=3), "onnx", [])])
        _validate(api, 3, echo)
        rollout = _rollout(api, 3, echo, bake_time_s=30)
        canary = api.get(f"/api/v1/rollouts/{rollout}").json()["devices"][0]["device_id"]
        _wait(
            "the canary to switch", lambda: _infer(agents[canary], x).json()["model_version"] == "3"
        )
        poison = x.copy()
        poison[0, 0] = 500.0
        failures = sum(_infer(agents[canary], poison).status_code >= 500 for _ in range(40))
        echo(f"{canary}: {failures} of 40 requests failed on version 3")
        doc = _follow(api, rollout, echo)
        echo(f"rollout {rollout}: {doc['state']}: {doc['reason']}")
        versions = {d: _infer(u, x).json()["model_version"] for d, u in agents.items()}
        echo("serving now: " + ", ".join(f"{d} v{v}" for d, v in versions.items()))
        ok = doc["state"] == RolloutState.ROLLED_BACK and set(versions.values()) == {"2"}
    echo("== done" if ok else "== the demo did not go as planned; see the logs")
    return 0 if ok else 1


def _start_broker(
    stack: ExitStack, workdir: Path, cp_state: Path, log_level: str
) -> tuple[str, str, dict[str, dict[str, str]]]:
    """A private Mosquitto with a password per device and the fleet ACL (the control plane's
    ``edgefleet fleet`` provisioning); return the URLs of its devices' listener and of the
    control plane's, and each client's credentials."""
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(mosquitto).exists():
        raise RuntimeError(
            "no mosquitto on this machine: install it or pass --mqtt mqtt://host:port"
        )
    access = FleetAccess(cp_state)
    credentials = {d: {"username": d, "password": access.add_device(d)} for d in DEVICES}
    service = access.service(CONTROL_PLANE_USER)
    credentials[CONTROL_PLANE_USER] = {
        "mqtt_username": service.user,
        "mqtt_password": service.password_file.read_text(),
    }
    port, cp_port = _free_port(), _free_port()
    # Started as root, mosquitto would drop to the "mosquitto" user: stay the user we are.
    owner = pwd.getpwuid(os.geteuid()).pw_name if os.geteuid() == 0 else None
    conf = access.write_config(
        workdir / "broker", port=port, bind="127.0.0.1", owner=owner, control_plane_port=cp_port
    )
    verbose = "log_type all\n" if log_level == "DEBUG" else ""
    conf.write_text(conf.read_text() + "log_dest stdout\n" + verbose)
    stack.enter_context(_process([mosquitto, "-c", str(conf)], workdir / "logs" / "mosquitto.log"))
    _wait("the broker", lambda: _port_open(port))
    return f"mqtt://127.0.0.1:{port}", f"mqtt://127.0.0.1:{cp_port}", credentials


def _push(api: httpx.Client, version: int, variants: list[tuple[Path, str, list[str]]]) -> None:
    spec = {
        "version": version,
        "variants": [{"format": f, "profiles": p} for _, f, p in variants],
        "health": {"window_s": 1.0, "min_requests": 100000},
    }
    api.post("/api/v1/models/mlp/versions", json=spec).raise_for_status()
    for i, (directory, fmt, _) in enumerate(variants):
        model_file = directory / ("model.tflite" if fmt == "tflite" else "model.onnx")
        api.put(
            f"/api/v1/models/mlp/versions/{version}/variants/{i}/files/{model_file.name}",
            content=model_file.read_bytes(),
        ).raise_for_status()
    api.put(
        f"/api/v1/models/mlp/versions/{version}/golden",
        content=(variants[0][0] / "golden.npz").read_bytes(),
    )


def _validate(api: httpx.Client, version: int, echo: Echo) -> None:
    report = api.post(f"/api/v1/models/mlp/versions/{version}/validate").json()
    for c in report["checks"]:
        echo(f"  {'PASS' if c['passed'] else 'FAIL'} {c['check']}")
    if not report["passed"]:
        raise RuntimeError(f"version {version} failed validation")


def _rollout(api: httpx.Client, version: int, echo: Echo, bake_time_s: float = 2.0) -> int:
    spec = {
        "model": "mlp",
        "version": version,
        "selector": {"site": "demo"},
        "waves": ["1", "100%"],
        "bake_time_s": bake_time_s,
        "device_timeout_s": 120,
        "gates": {"max_error_rate": 0.05, "min_requests": 10},
    }
    resp = api.post("/api/v1/rollouts", json=spec)
    resp.raise_for_status()
    echo(
        f"rollout {resp.json()['id']}: waves {spec['waves']}, bake {bake_time_s} s, "
        "error rate gate 5 %"
    )
    return int(resp.json()["id"])


def _follow(
    api: httpx.Client, rollout: int, echo: Echo, traffic: Callable[[], object] | None = None
) -> dict[str, Any]:
    """Print the rollout's progress until it ends; ``traffic`` is called between polls (live
    requests for the gates to judge: a wave with too few waits for them)."""
    seen = ""
    while True:
        if traffic is not None:
            traffic()
        doc = api.get(f"/api/v1/rollouts/{rollout}").json()
        line = " | ".join(
            f"wave {w['wave']}: " + " ".join(f"{s}={n}" for s, n in sorted(w["states"].items()))
            for w in doc["waves"]
        )
        if line != seen:
            echo(f"  {doc['state']:<12} {line}")
            seen = line
        if doc["state"] in FINISHED:
            echo(f"  {doc['state']}")
            return doc  # type: ignore[no-any-return]
        time.sleep(0.5)
