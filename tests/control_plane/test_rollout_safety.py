"""Rollouts that must not go wrong quietly: a spec out of range, two rollouts of one model on
one device, a wave in which no device committed, a device that timed out when the rollout rolls
back, a refusal repeated after a commit, the health gates of a device whose clock is off. Real
Mosquitto, a real control plane (SQLite and PostgreSQL), real agents, and one device played by
an MQTT client where its messages must be chosen."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from common.protocol.messages import (
    DesiredState,
    DeviceStatus,
    ModelTelemetry,
    ServedModel,
    Telemetry,
    UpdateEvent,
    UpdateState,
)
from control_plane.rollouts.events import REASON_LIMIT
from runtimes.examples.variants import mlp_version
from tests.access.mqtt_client import ProbeClient
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_rollouts import (
    push,
    rollout,
    served,
    validate,
    wait_devices,
    wait_rollout,
)
from tests.mqtt_broker import Mosquitto


def _devices(cp: RunningControlPlane, rollout_id: int) -> tuple[str, dict[str, str]]:
    doc = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
    return doc["state"], {d["device_id"]: d["state"] for d in doc["devices"]}


def test_rollout_specs_out_of_range_are_400s_naming_the_field(
    start_control_plane: ControlPlaneFactory,
) -> None:
    spec: dict[str, Any] = {"model": "mlp", "version": 2}
    with start_control_plane() as cp:
        for field, bad in [
            ("bake_time_s", 1e12),  # accepted before, then a date overflow: a 500, stuck
            ("device_timeout_s", 1e12),
            ("waves", ["nan"]),
            ("waves", ["1e400"]),
            ("waves", ["1.5"]),
        ]:
            resp = cp.admin.post("/api/v1/rollouts", json={**spec, field: bad})
            assert resp.status_code == 400, (field, bad, resp.text)
            assert resp.json()["error"].startswith(field), resp.text
        # JSON as Python reads it takes Infinity; no rollout does
        for field, raw in [
            ("bake_time_s", '"bake_time_s": Infinity'),
            ("gates", '"gates": {"max_p99_ratio": Infinity}'),
        ]:
            resp = cp.admin.post(
                "/api/v1/rollouts",
                content=f'{{"model": "mlp", "version": 2, {raw}}}',
                headers={"content-type": "application/json"},
            )
            assert resp.status_code == 400, (raw, resp.text)
            assert resp.json()["error"].startswith(field), resp.text
        assert cp.admin.get("/api/v1/rollouts").json() == []


@pytest.mark.slow
def test_a_second_rollout_of_a_model_on_the_same_device_waits_for_the_first(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp, start_agent("dev-a", cp) as a:
        wait_devices(cp, "dev-a")
        for version in (2, 3):
            push(
                cp.admin,
                "mlp",
                version,
                [(mlp_version(tmp_path / f"v{version}", seed=version), [])],
            )
            validate(cp.admin, "mlp", version)
        first = rollout(cp, 2, waves=["100%"], bake_time_s=600)
        wait_until(
            lambda: _devices(cp, first) == ("running", {"dev-a": "committed"}),
            what="dev-a to commit version 2",
        )
        spec = {"model": "mlp", "version": 3, "selector": {"site": "lab"}, "waves": ["100%"]}
        resp = cp.admin.post("/api/v1/rollouts", json=spec)
        assert resp.status_code == 409 and resp.json()["code"] == "busy", resp.text
        assert f"rollout {first} of mlp is still active on dev-a" in resp.json()["error"]
        assert cp.admin.post(f"/api/v1/rollouts/{first}/abort").status_code == 200
        wait_rollout(cp, first, "rolled_back")
        assert served(a) == "1"
        second = rollout(cp, 3, waves=["100%"], bake_time_s=0)
        assert wait_rollout(cp, second, "succeeded")["state"] == "succeeded"
        assert served(a) == "3"
        # listed a page at a time, newest first
        page = cp.admin.get("/api/v1/rollouts", params={"limit": 1}).json()
        assert [r["id"] for r in page] == [second]
        page = cp.admin.get("/api/v1/rollouts", params={"limit": 1, "before": second}).json()
        assert [r["id"] for r in page] == [first]
        resp = cp.admin.get("/api/v1/rollouts", params={"limit": 0})
        assert resp.status_code == 400 and resp.json()["error"].startswith("query.limit"), resp.text


@pytest.mark.slow
def test_a_wave_where_no_device_committed_fails_and_the_rollback_restores_the_silent_device(
    start_control_plane: ControlPlaneFactory,
    start_agent: AgentFactory,
    broker: Mosquitto,
    tmp_path: Path,
) -> None:
    with start_control_plane() as cp:
        with start_agent("dev-b", cp):  # known to the inventory, then away
            wait_devices(cp, "dev-b")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        rollout_id = rollout(
            cp, 2, selector={"group": "pi"}, waves=["100%"], bake_time_s=0, device_timeout_s=1
        )
        # Before: every device timed out, the gates saw no telemetry, and it "succeeded"
        doc = wait_rollout(cp, rollout_id, "rolled_back", "succeeded", timeout_s=30)
        assert doc["state"] == "rolled_back", doc
        reason = "no device of wave 1 committed the update (1 timed out, 0 refused it)"
        assert doc["reason"] == reason
        assert _devices(cp, rollout_id)[1] == {"dev-b": "reverted"}
        # its retained desired state no longer holds version 2 (before: it did, and the device
        # installed the rolled-back version when it came back)
        watcher = ProbeClient(broker.port)
        try:
            assert watcher.connect() == 0
            watcher.subscribe("edgefleet/devices/dev-b/desired")
            retained = watcher.wait(
                lambda: watcher.messages("edgefleet/devices/dev-b/desired"), "the desired state"
            )
            assert DesiredState.model_validate_json(retained[-1]).manifests == []
            # Its persistent session on the broker still holds version 2's desired state,
            # queued while it was away, ahead of the restored one. Coming back, it either drops
            # version 2 for the newer desired state that withdrew it, or, if it got there
            # first, commits it after the rollback ended: that commit reopens the rollback and
            # the rollback command takes it back. (Before: its row stayed timed_out, the commit
            # ended there, and it kept version 2.)
            events = "edgefleet/devices/dev-b/events"
            watcher.subscribe(events)
            with start_agent("dev-b", cp) as b:

                def answered() -> list[UpdateState]:
                    parsed = [UpdateEvent.model_validate_json(m) for m in watcher.messages(events)]
                    final = (UpdateState.COMMITTED, UpdateState.REJECTED)
                    return [
                        e.state
                        for e in parsed
                        if e.sequence == doc["sequence"] and e.state in final
                    ]

                outcome = watcher.wait(answered, "dev-b's answer to the queued desired state")

                def back() -> bool:
                    now = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
                    (row,) = now["devices"]
                    return bool(
                        now["state"] == "rolled_back"
                        and row["state"] == "reverted"
                        and (
                            UpdateState.COMMITTED not in outcome
                            or row["reason"].startswith("fleet_command")
                        )
                    )

                wait_until(back, timeout_s=60, what="dev-b back on version 1")
                assert served(b) == "1"
        finally:
            watcher.close()


def _probe_status(device_id: str) -> DeviceStatus:
    """The birth message of a probe device, labelled ``site=probe``, that serves nothing yet."""
    return DeviceStatus(
        device_id=device_id,
        online=True,
        agent_version="probe",
        hardware_profile="generic-x86_64",
        labels={"site": "probe"},
        models=[],
        sent_at=datetime.now(UTC),
    )


class ProbeDevices:
    """Devices played by one MQTT client (so their messages reach the control plane in order),
    labelled ``site=probe``, where a test must choose what a device says."""

    def __init__(self, client: ProbeClient, *device_ids: str) -> None:
        self.client = client
        self.status = {d: _probe_status(d) for d in device_ids}
        self.seq = dict.fromkeys(device_ids, 0)
        for device_id in device_ids:
            client.subscribe(f"edgefleet/devices/{device_id}/desired")
            client.subscribe(f"edgefleet/devices/{device_id}/commands")
            self.birth(device_id)

    def birth(self, device_id: str, **changes: Any) -> None:
        self.status[device_id] = self.status[device_id].model_copy(update=changes)
        payload = self.status[device_id].model_dump_json().encode()
        self.client.publish(f"edgefleet/devices/{device_id}/status", payload, retain=True)

    def manifest(self, device_id: str) -> dict[str, Any]:
        """The newest manifest of the device's desired state, once it holds one."""
        desired = self.client.wait(
            lambda: [
                d
                for raw in self.client.messages(f"edgefleet/devices/{device_id}/desired")
                if (d := DesiredState.model_validate_json(raw)).manifests
            ],
            "the rollout's desired state",
        )
        signed: dict[str, Any] = desired[-1].manifests[0]["signed"]
        return signed

    def event(
        self,
        device_id: str,
        manifest: dict[str, Any],
        state: UpdateState,
        code: str | None = None,
        reason: str | None = None,
    ) -> None:
        doc = UpdateEvent(
            device_id=device_id,
            event_id=uuid.uuid4().hex,
            time=datetime.now(UTC),
            model="mlp",
            version=2,
            sequence=manifest["sequence"],
            rollout_id=manifest["rollout_id"],
            state=state,
            code=code,
            reason=reason or (f"{code} (probe)" if code else None),
        )
        self.client.publish(f"edgefleet/devices/{device_id}/events", doc.model_dump_json().encode())

    def commands(self, device_id: str) -> list[bytes]:
        return self.client.messages(f"edgefleet/devices/{device_id}/commands")

    def telemetry(
        self, device_id: str, at: datetime, version: int, requests: int, errors: int, p99_ms: float
    ) -> None:
        """A telemetry window of mlp ``version`` dated ``at`` (by the device's clock)."""
        self.seq[device_id] += 1
        window = ModelTelemetry(
            model="mlp",
            version=version,
            requests=requests,
            errors=errors,
            rows=requests,
            batches=requests,
            p99_ms=p99_ms,
        )
        doc = Telemetry(
            device_id=device_id, seq=self.seq[device_id], time=at, window_s=10.0, models=[window]
        )
        self.client.publish(
            f"edgefleet/devices/{device_id}/telemetry", doc.model_dump_json().encode()
        )


def _probe_rollout(cp: RunningControlPlane, tmp_path: Path, devices: ProbeDevices) -> int:
    """Version 2 of mlp rolled out to the probe devices in one wave that bakes long."""
    wait_devices(cp, *devices.status)
    push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
    validate(cp.admin, "mlp", 2)
    return rollout(cp, 2, selector={"site": "probe"}, waves=["100%"], bake_time_s=600)


@pytest.mark.slow
def test_a_device_that_committed_stays_committed_when_a_refusal_of_it_repeats(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto, tmp_path: Path
) -> None:
    """A device that applied a manifest twice (a retry raced a redelivery) committed it, then
    refused the copy as superseded: the refusal must not undo the commit and fail the rollout."""
    client = ProbeClient(broker.port)
    with start_control_plane() as cp:
        try:
            assert client.connect() == 0
            devices = ProbeDevices(client, "dev-p", "dev-q")
            rollout_id = _probe_rollout(cp, tmp_path, devices)
            manifest = devices.manifest("dev-p")
            devices.event("dev-p", manifest, UpdateState.COMMITTED)
            wait_until(
                lambda: _devices(cp, rollout_id)[1]["dev-p"] == "committed", what="the commit"
            )
            devices.event("dev-p", manifest, UpdateState.REJECTED, "superseded")
            # acted on in order: once dev-q's fault shows, dev-p's refusal was acted on too
            devices.event("dev-q", manifest, UpdateState.DOWNLOADING, "disk_full")

            def dev_q_fault_shows() -> bool:
                rows = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()["devices"]
                return "disk_full" in {d["device_id"]: d["reason"] for d in rows}["dev-q"]

            wait_until(dev_q_fault_shows, what="dev-q's fault on the rollout")
            assert _devices(cp, rollout_id) == ("running", {"dev-p": "committed", "dev-q": "sent"})
        finally:
            client.close()


@pytest.mark.slow
def test_a_device_reason_of_many_kilobytes_is_kept_to_its_first_kilobyte(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto, tmp_path: Path
) -> None:
    """A self-test report can run to kilobytes, and it ends up in the rollout's reason and a
    ModelRollout's status: kept to REASON_LIMIT characters wherever it is stored."""
    client = ProbeClient(broker.port)
    with start_control_plane() as cp:
        try:
            assert client.connect() == 0
            devices = ProbeDevices(client, "dev-p")
            rollout_id = _probe_rollout(cp, tmp_path, devices)
            report = "golden output mismatch at " + "x" * 40_000
            manifest = devices.manifest("dev-p")
            devices.event(
                "dev-p", manifest, UpdateState.REJECTED, "self_test_failed", reason=report
            )
            wait_until(
                lambda: _devices(cp, rollout_id)[0] in ("rolling_back", "rolled_back"),
                what="the rollback",
            )
            doc = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
            (device,) = doc["devices"]
            assert device["reason"] == (
                "self_test_failed: " + report[:REASON_LIMIT] + "... [truncated]"
            )
            assert len(doc["reason"]) < REASON_LIMIT + 200, doc["reason"][:200]
        finally:
            client.close()


@pytest.mark.slow
def test_a_device_that_reconnects_while_its_rollback_waits_gets_the_command_again(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto, tmp_path: Path
) -> None:
    """A device records a rollback command only once it ran: one that crashed with the command
    still queued comes back without it. Its birth message brings the command again (also the
    way a command the broker lost with its state reaches a device: tests/control_plane/
    test_broker_reset.py)."""
    client = ProbeClient(broker.port)
    with start_control_plane() as cp:
        try:
            assert client.connect() == 0
            devices = ProbeDevices(client, "dev-p")
            rollout_id = _probe_rollout(cp, tmp_path, devices)
            manifest = devices.manifest("dev-p")
            devices.event("dev-p", manifest, UpdateState.COMMITTED)
            # and says so in its status, as an agent does: it serves version 2
            serving = [ServedModel(model="mlp", version=2, sequence=manifest["sequence"])]
            devices.birth("dev-p", models=serving)
            wait_until(
                lambda: _devices(cp, rollout_id) == ("running", {"dev-p": "committed"}),
                what="the commit",
            )
            assert cp.admin.post(f"/api/v1/rollouts/{rollout_id}/abort").status_code == 200
            client.wait(lambda: devices.commands("dev-p"), "the rollback command")
            # the device "crashed" with it queued, and comes back: a new birth message
            devices.birth("dev-p")
            sent = client.wait(
                lambda: len(devices.commands("dev-p")) >= 2 and devices.commands("dev-p"),
                "the rollback command again",
            )
            first, again = (json.loads(c)["signed"] for c in sent[:2])
            assert again["type"] == "rollback" and again["from_version"] == 2
            assert again["command_id"] != first["command_id"]
            assert _devices(cp, rollout_id) == ("rolling_back", {"dev-p": "reverting"})
        finally:
            client.close()


def _windows(cp: RunningControlPlane, **params: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = cp.admin.get("/api/v1/telemetry", params=params).json()
    return found


@pytest.mark.slow
@pytest.mark.parametrize("skew", [timedelta(days=-1), timedelta(days=1)], ids=["behind", "ahead"])
def test_the_error_gate_judges_a_device_whose_clock_is_off(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto, tmp_path: Path, skew: timedelta
) -> None:
    """The gates chose windows by the device's time: a device a day behind dated its windows
    before the rollout, one a day ahead after now, the gate saw neither ("fewer than
    min_requests: not judged") and the rollout went on over a version failing half its
    requests. (A day: raw windows older than the retention, two days, are folded away.)"""
    client = ProbeClient(broker.port)
    with start_control_plane() as cp:
        try:
            assert client.connect() == 0
            devices = ProbeDevices(client, "dev-p")
            rollout_id = _probe_rollout(cp, tmp_path, devices)
            devices.event("dev-p", devices.manifest("dev-p"), UpdateState.COMMITTED)
            wait_until(
                lambda: _devices(cp, rollout_id)[1] == {"dev-p": "committed"}, what="the commit"
            )
            devices.telemetry("dev-p", datetime.now(UTC) + skew, 2, 50, 25, 3.0)
            doc = wait_rollout(cp, rollout_id, "rolling_back", "rolled_back", timeout_s=30)
            assert doc["reason"].startswith("error rate 50.0% over 50 requests"), doc
            assert doc["gate_report"]["0"]["errors"] == 25
            # the rollout's telemetry shows what the gate counted, received in the last hour
            (window,) = _windows(cp, rollout_id=rollout_id)
            assert window["errors"] == 25
            received, dated = (datetime.fromisoformat(window[k]) for k in ("received_at", "time"))
            assert abs(dated - received - skew) < timedelta(minutes=1)
        finally:
            client.close()


@pytest.mark.slow
def test_the_latency_gate_compares_windows_received_before_and_after_the_rollout(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto, tmp_path: Path
) -> None:
    """The previous version's baseline is what the control plane received in the ten minutes
    before the rollout, whatever the device's clock says: here a day ahead, which dated both
    versions' windows past the gates' reach."""
    ahead = timedelta(days=1)
    client = ProbeClient(broker.port)
    with start_control_plane() as cp:
        try:
            assert client.connect() == 0
            devices = ProbeDevices(client, "dev-p")
            devices.birth("dev-p", models=[ServedModel(model="mlp", version=1)])
            devices.telemetry("dev-p", datetime.now(UTC) + ahead, 1, 50, 0, 2.0)
            wait_until(lambda: _windows(cp, model="mlp", version=1), what="version 1's window")
            rollout_id = _probe_rollout(cp, tmp_path, devices)
            devices.event("dev-p", devices.manifest("dev-p"), UpdateState.COMMITTED)
            wait_until(
                lambda: _devices(cp, rollout_id)[1] == {"dev-p": "committed"}, what="the commit"
            )
            devices.telemetry("dev-p", datetime.now(UTC) + ahead, 2, 50, 0, 20.0)
            doc = wait_rollout(cp, rollout_id, "rolling_back", "rolled_back", timeout_s=30)
            assert doc["reason"].startswith("p99 latency 20.0 ms is 10.00x"), doc
        finally:
            client.close()
