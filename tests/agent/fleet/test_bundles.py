"""Offline bundles on the agent's side (agent/fleet/bundles.py): a bundle handed in while the
agent is down is taken when it starts, its files come from the bundle (nothing is downloaded),
and the update goes through the health window to a commit; a bundle for another device is
refused. The end-to-end test with a real control plane is tests/control_plane/test_bundles.py."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from agent.bundle_install import hand_in, verdicts
from agent.launcher.journal import load_pending
from common.protocol.bundle import write_bundle
from common.protocol.messages import DesiredState
from runtimes.examples.variants import mlp_version
from tests.agent.fleet.conftest import AgentFactory
from tests.agent.fleet.publisher import Fleet
from tests.agent.fleet.test_updates import served
from tests.agent.launcher.test_verified import manifest as release_manifest
from tests.agent.launcher.test_verified import tarball


def bundle(fleet: Fleet, path: Path, device_id: str, envelope: dict[str, object]) -> Path:
    signed = envelope["signed"]
    assert isinstance(signed, dict)
    digests = [f["sha256"] for v in signed["artifacts"] for f in v["files"]]
    digests += [signed["golden"]["sha256"]] if signed["golden"] else []
    desired = DesiredState(device_id=device_id, issued_at=datetime.now(UTC), manifests=[envelope])
    with path.open("wb") as out:
        write_bundle(out, desired, {d: fleet.artifacts.root / d for d in digests})
    return path


def test_a_bundle_handed_in_while_the_agent_is_down_is_taken_at_start_without_download(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state-dev-1"
    envelope = fleet.sign(fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=99)))
    good = hand_in(bundle(fleet, tmp_path / "good.tar", "dev-1", envelope), state_dir)
    other = hand_in(bundle(fleet, tmp_path / "other.tar", "dev-9", envelope), state_dir)
    with fleet_agent() as agent:
        taken = verdicts(good, 30)
        assert taken is not None and [(r["model"], r["accepted"]) for r in taken] == [
            ("mlp", True)
        ], taken
        refused = verdicts(other, 30)
        assert refused is not None and refused[0]["code"] == "wrong_target", refused
        assert "desired state for device dev-9" in refused[0]["reason"]
        fleet.wait_event("dev-1", "committed", sequence=1)
        assert served(agent)[0] == "2"
        assert fleet.artifacts.requests == []  # every file came from the bundle
        assert not good.exists() and not other.exists()  # taken, and gone from the inbox
        states = [e.state.value for e in fleet.events("dev-1") if e.sequence == 1]
        assert states[0] == "received" and states[-1] == "committed", states


def test_an_agent_release_in_a_bundle_goes_to_the_launcher_without_download(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    """Its artifact is put where the release's download would go (the URL leads nowhere),
    installed and verified by the launcher's code, and left pending for its trial; an agent
    under no launcher refuses it (``no_launcher``)."""
    root = tmp_path / "launcher"
    root.mkdir()
    artifact = tarball(tmp_path, "2.0.0")
    envelope = fleet.sign(release_manifest(artifact, "2.0.0", 3))
    digest = envelope["signed"]["artifact"]["sha256"]
    desired = DesiredState(device_id="dev-1", issued_at=datetime.now(UTC), manifests=[envelope])
    path = tmp_path / "release.tar"
    with path.open("wb") as out:
        write_bundle(out, desired, {digest: artifact})
    handed = hand_in(path, tmp_path / "state-dev-1")
    with fleet_agent(launcher_journal_file=root / "launcher.json"):
        taken = verdicts(handed, 30)
        assert taken is not None and [(r["model"], r["version"], r["accepted"]) for r in taken] == [
            ("@agent", "2.0.0", True)
        ], taken
        fleet.wait(lambda: load_pending(root), what="the release pending for its trial")
        pending = load_pending(root)
        assert pending is not None and pending.version == "2.0.0"
    with fleet_agent(device_id="dev-2") as _:
        other = DesiredState(device_id="dev-2", issued_at=datetime.now(UTC), manifests=[envelope])
        with path.open("wb") as out:
            write_bundle(out, other, {digest: artifact})
        refused = verdicts(hand_in(path, tmp_path / "state-dev-2"), 30)
        assert refused is not None and refused[0]["code"] == "no_launcher", refused
