"""Faults on real processes: the broker killed mid-update, a device offline during publication,
the agent SIGKILLed during a download and during a switch, telemetry while the broker is down,
a disk that refuses the outbox's writes."""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import tomli_w

from common.protocol.messages import DeviceStatus
from common.protocol.signing import SigningKey
from runtimes.examples.variants import mlp_version
from tests.agent.fleet.artifacts import Fault
from tests.agent.fleet.conftest import AgentFactory, fleet_settings
from tests.agent.fleet.publisher import Fleet
from tests.agent.fleet.test_updates import served
from tests.agent.process import AgentProcess, agent_process
from tests.agent.server import copy_models, wait_until
from tests.mqtt_broker import Mosquitto


@pytest.mark.slow
def test_broker_killed_and_restarted_mid_update_the_update_completes(
    fleet: Fleet, fleet_agent: AgentFactory, broker: Mosquitto, tmp_path: Path
) -> None:
    v2 = mlp_version(tmp_path / "v2", seed=2)
    payload = fleet.manifest("mlp", 2, 1, v2)
    hold = threading.Event()
    fleet.artifacts.faults[payload["artifacts"][0]["files"][0]["sha256"]] = Fault(hold=hold)
    with fleet_agent() as agent:
        fleet.publish_desired("dev-1", fleet.sign(payload))
        fleet.wait_event("dev-1", "downloading", sequence=1)
        broker.stop(kill=True)  # mid-download
        wait_until(lambda: not agent.state.fleet.connected.is_set(), what="the agent to notice")  # type: ignore[union-attr]
        broker.start()
        hold.set()
        fleet.wait_event("dev-1", "committed", sequence=1)
        assert served(agent)[0] == "2"
        assert agent.state.fleet.connected.is_set()  # type: ignore[union-attr]


@pytest.mark.slow
def test_device_offline_during_publication_converges_on_reconnect(
    fleet: Fleet, fleet_agent: AgentFactory, example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with fleet_agent(repo=repo) as agent:
        assert served(agent)[0] == "1"
    # the observer receives the offline status through the broker, a moment after the exit
    wait_until(
        lambda: any(not s.online for s in fleet.statuses("dev-1")),
        what="the offline status a clean shutdown publishes",
    )
    fleet.publish_desired(
        "dev-1", fleet.sign(fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=2)))
    )
    with fleet_agent(repo=repo) as agent:  # same repository and state directory: the same device
        fleet.wait_event("dev-1", "committed", sequence=1)
        assert served(agent)[0] == "2"


def _process_config(
    tmp_path: Path, fleet: Fleet, broker: Mosquitto, repo: Path, **fleet_extra: object
) -> Path:
    settings = fleet_settings(fleet, broker, tmp_path / "state", device_id="dev-k", **fleet_extra)
    fleet_values = settings.model_dump(exclude_none=True)
    as_toml = {k: (str(v) if isinstance(v, Path) else v) for k, v in fleet_values.items()}
    doc = {"model_repository": str(repo), "port": 0, "log_level": "INFO", "fleet": as_toml}
    path = tmp_path / "agent.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


def _version_answering(address: str) -> str:
    body = {
        "inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": [0.0] * 256}]
    }
    return str(httpx.post(f"{address}/v2/models/mlp/infer", json=body).json()["model_version"])


def _first_loaded(agent: AgentProcess) -> object:
    """The version of mlp the agent's start-up load brought up (from its JSON log)."""

    def loaded() -> list[dict[str, object]]:
        return [
            r
            for r in agent.logs
            if r.get("message") == "version loaded" and r.get("model") == "mlp"
        ]

    wait_until(loaded, what="the start-up load")
    return loaded()[0]["version"]


def _ready(address: str) -> bool:
    try:
        return httpx.get(f"{address}/v2/health/ready").status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_sigkill_during_download_resumes_and_commits(
    fleet: Fleet, broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    config = _process_config(tmp_path, fleet, broker, repo)
    payload = fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=2))
    model_ref = payload["artifacts"][0]["files"][0]
    hold = threading.Event()
    fleet.artifacts.faults[model_ref["sha256"]] = Fault(hold=hold)
    fleet.publish_desired("dev-k", fleet.sign(payload))
    with agent_process("--config", str(config)) as agent:
        fleet.wait_event("dev-k", "downloading", sequence=1)
        wait_until(
            lambda: any(p.stat().st_size > 0 for p in (repo / ".staging").glob("*.part")),
            what="a partial download",
        )
        agent.proc.kill()
        agent.proc.wait(timeout=30)
    # the broker publishes the last will for the vanished device
    fleet.wait(lambda: [s for s in fleet.statuses("dev-k") if not s.online], what="the last will")
    hold.set()
    with agent_process("--config", str(config)) as agent:
        assert _first_loaded(agent) == 1  # the committed version serves after the crash
        fleet.wait(
            lambda: [e for e in fleet.events("dev-k") if e.state.value == "committed"],
            what="commit",
        )
        wait_until(lambda: _ready(agent.address), what="readiness")
        assert _version_answering(agent.address) == "2"
    ranges = [r for d, r in fleet.artifacts.requests if d == model_ref["sha256"]]
    assert ranges[0] is None and ranges[-1] is not None and ranges[-1].startswith("bytes="), (
        ranges
    )  # resumed


@pytest.mark.slow
def test_sigkill_during_the_switch_comes_back_on_the_committed_version(
    fleet: Fleet, broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    config = _process_config(tmp_path, fleet, broker, repo)
    v2 = mlp_version(tmp_path / "v2", seed=2)
    # a long health window: the SIGKILL lands while version 2 is active but not committed
    fleet.publish_desired(
        "dev-k", fleet.sign(fleet.manifest("mlp", 2, 1, v2, health={"window_s": 3600}))
    )
    with agent_process("--config", str(config)) as agent:
        fleet.wait_event("dev-k", "active", sequence=1)
        agent.proc.kill()
        agent.proc.wait(timeout=30)
    assert (repo / "mlp/2").is_dir() and "specific = [\n    1,\n]" in (
        repo / "mlp/config.toml"
    ).read_text()
    # the same manifest with a short window, as an operator would publish next
    fleet.publish_desired("dev-k", fleet.sign(fleet.manifest("mlp", 2, 2, v2)))
    with agent_process("--config", str(config)) as agent:
        assert _first_loaded(agent) == 1
        fleet.wait_event("dev-k", "committed", sequence=2)
        wait_until(lambda: _ready(agent.address), what="readiness")
        assert _version_answering(agent.address) == "2"


@pytest.mark.slow
def test_a_device_restarted_without_its_broker_serves_what_it_committed(
    fleet: Fleet, broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    """Issue 51, item 2: after a reboot with the network gone, the agent serves the last
    committed version from its own store, is ready without the broker, and reports in once
    the broker is back."""
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    config = _process_config(tmp_path, fleet, broker, repo)
    v2 = mlp_version(tmp_path / "v2", seed=2)
    fleet.publish_desired("dev-k", fleet.sign(fleet.manifest("mlp", 2, 1, v2)))
    with agent_process("--config", str(config)) as agent:
        fleet.wait_event("dev-k", "committed", sequence=1)
    broker.stop(kill=True)  # the network is gone across the "reboot"
    with agent_process("--config", str(config)) as agent:
        wait_until(lambda: _ready(agent.address), what="readiness without a broker")
        assert _version_answering(agent.address) == "2"
        assert _first_loaded(agent) == 2
        before = len(fleet.statuses("dev-k"))
        broker.start()
        fleet.wait(
            lambda: len(fleet.statuses("dev-k")) > before and fleet.statuses("dev-k")[-1].online,
            what="the device's status once the broker is back",
        )
        assert _version_answering(agent.address) == "2"


@pytest.mark.slow
def test_telemetry_while_the_broker_is_down_arrives_after_reconnect_none_lost(
    fleet: Fleet, fleet_agent: AgentFactory, broker: Mosquitto
) -> None:
    with fleet_agent() as agent:
        client = agent.state.fleet
        assert client is not None
        fleet.wait(lambda: len(fleet.telemetry("dev-1")) >= 3, what="telemetry")
        broker.stop(kill=True)
        wait_until(lambda: not client.connected.is_set(), what="the agent to notice")
        wait_until(lambda: len(client.outbox) >= 10, what="telemetry to pile up offline")
        buffered = len(client.outbox)
        for _ in range(20):  # and traffic while offline, so the telemetry carries counts
            agent.client.post("/v1/models/mlp:predict", json={"instances": [[0.0] * 256]})
        broker.start()
        wait_until(
            lambda: client.connected.is_set() and len(client.outbox) == 0,
            what="the outbox to drain",
        )
        produced = client.outbox_seq()

        def seqs_through_produced() -> list[int]:
            s = sorted({t.seq for t in fleet.telemetry("dev-1")})
            return s if s and s[-1] >= produced else []

        seqs = fleet.wait(seqs_through_produced, what="every telemetry message")
    assert seqs[:produced] == list(range(1, produced + 1)), "telemetry was lost"
    assert buffered >= 10
    assert all(t.dropped == 0 for t in fleet.telemetry("dev-1"))
    last = fleet.telemetry("dev-1")[-1]
    assert last.device.memory_total_bytes and last.device.cpu_percent is not None
    counted = sum(
        m.requests for t in fleet.telemetry("dev-1") for m in t.models if m.model == "mlp"
    )
    assert counted >= 20  # the offline traffic was reported after reconnect


@pytest.mark.slow
def test_will_delay_a_quick_restart_shows_no_offline_and_a_device_that_stays_away_does(
    fleet: Fleet, broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    delay_s = 8
    config = _process_config(tmp_path, fleet, broker, repo, will_delay_s=delay_s)
    with agent_process("--config", str(config)) as agent:
        fleet.wait(lambda: [s for s in fleet.statuses("dev-k") if s.online], what="the birth")
        agent.proc.kill()  # a crash: no goodbye, only the will
        agent.proc.wait(timeout=30)
        killed_at, killed_wall = time.monotonic(), datetime.now(UTC)

    def since_crash() -> list[DeviceStatus]:
        return [s for s in fleet.statuses("dev-k") if s.sent_at and s.sent_at > killed_wall]

    def offline() -> list[DeviceStatus]:  # the will is the birth's twin, sent_at and all
        return [s for s in fleet.statuses("dev-k") if not s.online]

    config = _process_config(tmp_path, fleet, broker, repo, will_delay_s=1)
    with agent_process("--config", str(config)) as agent:  # the same device, back at once
        fleet.wait(since_crash, what="the birth after the restart")
        # Something that must not happen is waited for past its time: the first will was due
        # delay_s after the crash, and the device resumed its session before that.
        time.sleep(max(0.0, killed_at + delay_s + 2 - time.monotonic()))
        assert offline() == []
        agent.proc.kill()  # and now it stays away
        agent.proc.wait(timeout=30)
    fleet.wait(offline, what="the last will, a second after the crash")


REFUSED = "outbox cannot store, counting what is lost"
STOPPED = "fleet client stopped"


def _quiet(fleet: Fleet, device_id: str, for_s: float) -> Callable[[], bool]:
    """A predicate: no telemetry from the device for ``for_s`` (five of its intervals here)."""
    seen = [len(fleet.telemetry(device_id)), time.monotonic()]

    def quiet() -> bool:
        count = len(fleet.telemetry(device_id))
        if count != seen[0]:
            seen[:] = [count, time.monotonic()]
        return time.monotonic() - seen[1] >= for_s

    return quiet


@pytest.mark.slow
def test_a_disk_that_refuses_writes_keeps_the_device_on_the_fleet_and_the_loss_is_counted(
    fleet: Fleet, broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    config = _process_config(tmp_path, fleet, broker, repo)
    outbox = tmp_path / "state/outbox.sqlite3"

    def offline() -> list[DeviceStatus]:
        return [s for s in fleet.statuses("dev-k") if not s.online]

    with agent_process("--config", str(config)) as agent:
        fleet.wait(lambda: len(fleet.telemetry("dev-k")) >= 3, what="telemetry")
        # A file size limit on the agent alone, as a full disk: a write past it fails (EFBIG;
        # CPython ignores SIGXFSZ). The outbox files are past one page already, and SQLite
        # writes whole pages: each of its next writes fails.
        limit = 4096
        assert all(p.stat().st_size >= limit for p in (outbox, Path(f"{outbox}-wal")))
        soft, hard = resource.prlimit(agent.proc.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(agent.proc.pid, resource.RLIMIT_FSIZE, (limit, hard))
        try:
            wait_until(
                lambda: {REFUSED, STOPPED} & set(agent.log_messages()) or offline(),
                what="the refused write",
            )
            assert STOPPED not in agent.log_messages()
            assert not offline()
            wait_until(lambda: _ready(agent.address), what="readiness")
            assert _version_answering(agent.address) == "1"  # still serving
            # the first refused write may be an acknowledgement: telemetry rounds lost too
            wait_until(_quiet(fleet, "dev-k", 1.0), what="telemetry to stop arriving")
            before = max(t.seq for t in fleet.telemetry("dev-k"))
        finally:
            resource.prlimit(agent.proc.pid, resource.RLIMIT_FSIZE, (soft, hard))
        after = fleet.wait(
            lambda: [t for t in fleet.telemetry("dev-k") if t.dropped > 0],
            what="telemetry counting what the disk refused",
        )[0]
        assert after.seq > before
        assert "outbox storing again" in agent.log_messages()
        assert agent.log_messages().count(REFUSED) == 1  # once, not once a message
        assert STOPPED not in agent.log_messages() and not offline()
    seqs = sorted({t.seq for t in fleet.telemetry("dev-k")})
    assert seqs == list(range(1, seqs[-1] + 1)), "the numbering did not continue"


@pytest.mark.slow
def test_a_rollback_command_lost_in_a_crash_runs_when_it_is_sent_again(
    fleet: Fleet, broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    config = _process_config(tmp_path, fleet, broker, repo)
    v3 = fleet.manifest("mlp", 3, 2, mlp_version(tmp_path / "v3", seed=3))
    hold = threading.Event()
    fleet.artifacts.faults[v3["artifacts"][0]["files"][0]["sha256"]] = Fault(hold=hold)
    v2 = fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=2))
    with agent_process("--config", str(config)) as agent:
        fleet.publish_desired("dev-k", fleet.sign(v2))
        fleet.wait_event("dev-k", "committed", sequence=1)
        fleet.publish_desired("dev-k", fleet.sign(v3))
        fleet.wait_event("dev-k", "downloading", sequence=2)  # the updater is busy with it
        command_id = fleet.command("dev-k", "mlp", from_version=2)  # waits behind the download
        # one signed by a key the device does not know, refused at once: handled in order, so
        # once it is refused, the rollback is taken
        fleet.command("dev-k", "mlp", key=SigningKey.generate())
        fleet.wait(
            lambda: [e for e in fleet.events("dev-k") if e.code == "unknown_key"],
            what="the marker's refusal",
        )
        agent.proc.kill()
        agent.proc.wait(timeout=30)
    hold.set()
    # the rollout rolls back: the desired state no longer asks for version 3
    fleet.publish_raw(fleet.topics.desired("dev-k"), b"", retain=True)
    with agent_process("--config", str(config)) as agent:
        # the control plane sends a command not answered yet again at the device's next birth
        fleet.command("dev-k", "mlp", command_id=command_id, from_version=2)
        event = fleet.wait_event("dev-k", "rolled_back")
        assert event.code == "fleet_command" and event.version == 1, event
        wait_until(lambda: _ready(agent.address), what="readiness")
        assert _version_answering(agent.address) == "1"
