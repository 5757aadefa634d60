"""A version taken out of service reports its last window: a canary rolled back 1 s after it
was switched to, under traffic that errors, shows in the control plane's telemetry with the
request and error counts of the agent's own /metrics, and so does the version it replaced.

A real Mosquitto, a real control plane (SQLite), a real agent with its fleet client. The
telemetry interval is longer than the canary lives, so its whole life falls in the window that
ends after it was switched out (before the fix it never appeared at all). Requests still in
flight at the switch finish on the version switched out, in a later window, and count there."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.fleet.settings import FleetSettings
from agent.inference.stats import MODEL_ERROR_CODES
from agent.inference.versions import RuntimeFactory
from runtimes.backends import open_model
from runtimes.examples.variants import fragile_mlp_version
from tests.agent.fakes import Gate, gated_factory
from tests.agent.server import RunningAgent, copy_models, serve, wait_until
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.control_plane.test_rollouts import (
    X,
    infer,
    push,
    served,
    validate,
    wait_devices,
    wait_rollout,
)
from tests.mqtt_broker import Mosquitto, free_port

pytestmark = pytest.mark.slow  # each test rolls out and back under traffic

TELEMETRY_INTERVAL_S = 2.5
CANARY_LIFE_S = 1.0
POISON = X.copy()
POISON[:, 0] = 500.0  # the fragile version fails on it (inference_failed); version 1 does not
CLIENTS = 4


class Traffic:
    """Clients sending requests to the agent's default version without pause, every other one
    poisoned once :attr:`poison` is set, until stopped."""

    def __init__(self, agent: RunningAgent) -> None:
        self.agent = agent
        self.poison = threading.Event()
        self.stop = threading.Event()
        self.answers: dict[str, int] = {}
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._send, name=f"traffic-{i}", daemon=True)
            for i in range(CLIENTS)
        ]

    def _send(self) -> None:
        with httpx.Client(base_url=self.agent.url, timeout=60) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                x = POISON if self.poison.is_set() and n % 2 else X
                tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32"}
                body = {"inputs": [{**tensor, "data": x.ravel().tolist()}]}
                resp = client.post("/v2/models/mlp/infer", json=body)
                key = resp.json().get("model_version", "") if resp.is_success else "error"
                with self._lock:
                    self.answers[key] = self.answers.get(key, 0) + 1

    @contextmanager
    def running(self) -> Iterator[Traffic]:
        for t in self._threads:
            t.start()
        try:
            yield self
        finally:
            self.stop.set()
            for t in self._threads:
                t.join(timeout=60)

    def served(self) -> dict[str, int]:
        with self._lock:
            return dict(self.answers)


def agent_counts(agent: RunningAgent) -> dict[int, tuple[int, int]]:
    """(requests, errors) by version of mlp, from the agent's /metrics."""
    counts: dict[int, tuple[int, int]] = {}
    text = agent.client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name != "edgefleet_requests":
            continue
        for sample in family.samples:
            if sample.labels["model"] != "mlp" or not sample.name.endswith("_total"):
                continue
            version = int(sample.labels["version"])
            n = int(sample.value)
            requests, errors = counts.get(version, (0, 0))
            error = sample.labels["outcome"] in MODEL_ERROR_CODES
            counts[version] = (requests + n, errors + (n if error else 0))
    return counts


def stored_counts(cp: RunningControlPlane) -> dict[int, tuple[int, int]]:
    """(requests, errors) by version of mlp, summed over the control plane's stored windows."""
    windows = cp.admin.get(
        "/api/v1/telemetry", params={"device_id": "dev-a", "model": "mlp", "limit": 10000}
    ).json()
    counts: dict[int, tuple[int, int]] = {}
    for w in windows:
        requests, errors = counts.get(w["version"], (0, 0))
        counts[w["version"]] = (requests + w["requests"], errors + w["errors"])
    return {v: c for v, c in counts.items() if c != (0, 0)}  # /metrics lists no idle version


def wait_stored(cp: RunningControlPlane, expected: dict[int, tuple[int, int]]) -> None:
    """Wait until the control plane's sums are ``expected``; else fail showing both."""
    try:
        wait_until(
            lambda: stored_counts(cp) == expected,
            timeout_s=6 * TELEMETRY_INTERVAL_S,
            what="the control plane's telemetry to match the agent's /metrics",
        )
    except TimeoutError:
        assert stored_counts(cp) == expected


def in_flight(agent: RunningAgent, version: int) -> int:
    """Requests accepted and not yet answered by a served version of mlp, from /metrics."""
    for family in text_string_to_metric_families(agent.client.get("/metrics").text):
        if family.name == "edgefleet_pending_requests":
            for sample in family.samples:
                if sample.labels == {"model": "mlp", "version": str(version)}:
                    return int(sample.value)
    return 0


@contextmanager
def running_stack(
    tmp_path: Path, broker: Mosquitto, example_repo: Path, factory: RuntimeFactory = open_model
) -> Iterator[tuple[RunningControlPlane, RunningAgent]]:
    db = f"sqlite+aiosqlite:///{tmp_path}/control-plane.db"
    with control_plane(tmp_path / "cp-state", db, broker.url, free_port()) as cp:
        fleet = FleetSettings(
            mqtt_url=broker.url,
            device_id="dev-a",
            labels={"site": "lab"},
            state_dir=tmp_path / "state-dev-a",
            trust_root_file=cp.trust_root_file,
            telemetry_interval_s=TELEMETRY_INTERVAL_S,
            reconnect_min_s=0.05,
            reconnect_max_s=0.5,
        )
        repo = copy_models(example_repo, tmp_path / "repo", "mlp")
        with serve(repo, fleet=fleet, runtime_factory=factory) as agent:
            wait_devices(cp, "dev-a")
            yield cp, agent


def rollout_devices(cp: RunningControlPlane, rollout_id: int) -> dict[str, str]:
    doc = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
    return {d["device_id"]: d["state"] for d in doc["devices"]}


def start_rollout(cp: RunningControlPlane, **gates: Any) -> int:
    spec = {
        "model": "mlp",
        "version": 2,
        "selector": {"site": "lab"},
        "waves": ["100%"],
        "bake_time_s": 60,
        "device_timeout_s": 60,
        "gates": gates,
    }
    resp = cp.admin.post("/api/v1/rollouts", json=spec)
    assert resp.status_code == 201, resp.text
    return int(resp.json()["id"])


@pytest.mark.parametrize("rollback", ["device", "fleet"])
def test_a_canary_rolled_back_within_one_window_reports_what_it_served(
    tmp_path: Path, broker: Mosquitto, example_repo: Path, rollback: str
) -> None:
    with running_stack(tmp_path, broker, example_repo) as (cp, agent):
        # "device": its own health window rolls it back once its errors pass 5 % of 20 requests;
        # "fleet": the operator aborts the rollout and the control plane sends a rollback command.
        health = (
            {"window_s": 60, "max_error_rate": 0.05, "min_requests": 20, "self_test": False}
            if rollback == "device"
            else {"window_s": 0.2, "min_requests": 100000}
        )
        push(cp.admin, "mlp", 2, [(fragile_mlp_version(tmp_path / "v2", seed=5), [])], health)
        assert validate(cp.admin, "mlp", 2)["passed"]
        traffic = Traffic(agent)
        with traffic.running():
            wait_until(lambda: traffic.served().get("1", 0) > 20, what="traffic on version 1")
            rollout_id = start_rollout(cp, min_requests=100000, max_rejections=1)
            wait_until(
                lambda: "2" in traffic.served(), timeout_s=60, what="the switch to version 2"
            )
            switched = time.monotonic()
            if rollback == "fleet":
                traffic.poison.set()
            time.sleep(CANARY_LIFE_S)
            if rollback == "device":
                traffic.poison.set()  # its health window sees the errors and switches back
            else:
                resp = cp.admin.post(f"/api/v1/rollouts/{rollout_id}/abort")
                assert resp.status_code == 200, resp.text
            wait_until(
                lambda: agent.infer_json("mlp", X).json()["model_version"] == "1",
                timeout_s=30,
                what="the switch back to version 1",
            )
            lived_s = time.monotonic() - switched
            time.sleep(0.2)  # version 1 serves a while after the switch back
        doc = wait_rollout(cp, rollout_id, "rolled_back")
        assert doc["state"] == "rolled_back", doc

        expected = agent_counts(agent)
        requests_2, errors_2 = expected[2]
        assert requests_2 > errors_2 > 0, expected  # the canary served, and some of it failed
        wait_stored(cp, expected)
        time.sleep(2 * TELEMETRY_INTERVAL_S)  # two more windows: nothing is counted again
        assert stored_counts(cp) == agent_counts(agent) == expected
        print(f"{rollback}: lived {lived_s:.2f} s; (requests, errors) by version {expected}")


def test_requests_in_flight_at_the_switch_count_for_the_version_that_drains_them(
    tmp_path: Path, broker: Mosquitto, example_repo: Path
) -> None:
    gate = Gate(closed=False)
    gate.held_marks = {7.0, 777.0}  # batches with these rows wait in the runtime
    held = {"ok": X.copy(), "poisoned": X.copy()}
    held["ok"][:, 0], held["poisoned"][:, 0] = 7.0, 777.0
    answers: dict[str, httpx.Response] = {}
    with ExitStack() as stack:
        cp, agent = stack.enter_context(
            running_stack(tmp_path, broker, example_repo, gated_factory(gate))
        )
        stack.callback(gate.release)  # a request left held would keep the agent from stopping
        v2 = fragile_mlp_version(tmp_path / "v2", seed=5)
        # no self-test after the window: it would queue behind the held requests
        health = {"window_s": 0.2, "min_requests": 100000, "self_test": False}
        push(cp.admin, "mlp", 2, [(v2, [])], health)
        assert validate(cp.admin, "mlp", 2)["passed"]
        rollout_id = start_rollout(cp, min_requests=100000)
        wait_until(
            lambda: rollout_devices(cp, rollout_id) == {"dev-a": "committed"},
            timeout_s=60,
            what="version 2 committed",
        )
        assert served(agent) == "2"
        senders = [
            threading.Thread(target=lambda k=k: answers.__setitem__(k, infer(agent, held[k])))
            for k in held
        ]
        for t in senders:
            t.start()
        wait_until(lambda: in_flight(agent, 2) == 2, what="two requests in flight on version 2")
        assert cp.admin.post(f"/api/v1/rollouts/{rollout_id}/abort").status_code == 200
        # no request to find out: one to version 2 would wait behind the held ones
        wait_until(
            lambda: agent.client.get("/v2/models/mlp").json()["versions"] == ["1"],
            what="the switch back to version 1",
        )
        assert wait_rollout(cp, rollout_id, "rolled_back")["state"] == "rolled_back"
        time.sleep(TELEMETRY_INTERVAL_S + 0.5)  # a window ends while version 2 still drains
        assert not answers
        gate.release()
        for t in senders:
            t.join(timeout=60)
        # both finished on the version switched out, one of them failing there
        assert answers["ok"].json()["model_version"] == "2"
        assert answers["poisoned"].status_code == 500, answers["poisoned"].text
        expected = agent_counts(agent)
        wait_stored(cp, expected)
        print(f"drain: (requests, errors) by version {expected}")
