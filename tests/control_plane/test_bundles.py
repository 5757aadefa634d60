"""Offline bundles end to end (issue 51, item 3): a real control plane makes a bundle
(``edgefleet bundle create``), the broker goes away, ``edgefleet bundle install`` hands it to a
real agent that verifies it as an MQTT update and applies it with its health window; a
tampered, a replayed and an expired bundle are refused with their reason while the installed
version keeps serving; once the broker is back the control plane shows the device serving the
bundle's version and the events of the install, and does not send it back."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from common.protocol.bundle import DESIRED, write_bundle
from common.protocol.messages import DesiredState, ModelManifest
from common.release_tree import pack
from runtimes.examples.variants import mlp_version
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_operations import edgefleet
from tests.control_plane.test_rollouts import push, served, validate, wait_devices
from tests.mqtt_broker import Mosquitto


def install(
    bundle: Path, state_dir: Path, command: str = "bundle"
) -> subprocess.CompletedProcess[str]:
    """``edgefleet bundle install``, or with ``command="agent"`` the same as ``edgefleet agent
    install`` (the name issue 51 gives it)."""
    exe = Path(sys.executable).parent / "edgefleet"
    args = [str(exe), command, "install", str(bundle), "--state-dir", str(state_dir)]
    return subprocess.run(
        [*args, "--wait-s", "60"], capture_output=True, text=True, env=dict(os.environ), timeout=120
    )


def retarred(src: Path, dest: Path, change: Any) -> Path:
    """A copy of bundle ``src`` with ``change(name, data) -> data`` applied to each member."""
    with tarfile.open(src) as tar, tarfile.open(dest, "w") as out:
        for member in tar.getmembers():
            fh = tar.extractfile(member)
            assert fh is not None
            data = change(member.name, fh.read())
            member.size = len(data)
            out.addfile(member, io.BytesIO(data))
    return dest


def expired_bundle(cp: RunningControlPlane, good: Path, dest: Path) -> Path:
    """The good bundle's manifest, newer (sequence 1000) but expired a day ago, signed with
    the control plane's own key: refused for its expiry alone."""
    with tarfile.open(good) as tar:
        fh = tar.extractfile(DESIRED)
        assert fh is not None
        desired = DesiredState.model_validate_json(fh.read())
    manifest = ModelManifest.model_validate(desired.manifests[0]["signed"])
    now = datetime.now(UTC)
    old = manifest.model_copy(
        update={
            "sequence": 1000,
            "issued_at": now - timedelta(days=2),
            "expires_at": now - timedelta(days=1),
        }
    )
    signed = cp.services.keys.sign_message(old)
    files = {f.sha256: cp.services.store.path(f.sha256) for v in old.artifacts for f in v.files}
    with dest.open("wb") as out:
        write_bundle(out, desired.model_copy(update={"manifests": [signed]}), files)
    return dest


def events(cp: RunningControlPlane, device_id: str) -> list[dict[str, Any]]:
    resp = cp.admin.get(f"/api/v1/devices/{device_id}/events", params={"limit": 1000})
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


@pytest.mark.slow
def test_a_bundle_installs_offline_and_the_control_plane_sees_it_after_reconnect(
    start_control_plane: ControlPlaneFactory,
    start_agent: AgentFactory,
    broker: Mosquitto,
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "state-dev-a"
    with start_control_plane() as cp, start_agent("dev-a", cp) as agent:
        wait_devices(cp, "dev-a")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        broker.stop()  # the site loses its uplink: nothing reaches the device but the file
        op = cp.token("operator", "ops")
        bundle = tmp_path / "dev-a.bundle.tar"
        made = edgefleet(
            cp, op, "bundle", "create", "--device", "dev-a", "--model", "mlp:2", "-o", str(bundle)
        )
        assert made.returncode == 0, made.stderr
        assert made.stdout.startswith(f"wrote {bundle} (") and "mlp v2 for dev-a" in made.stdout
        # a bundle of a version not validated is refused by name, and no file is written
        unvalidated = edgefleet(
            cp,
            op,
            "bundle",
            "create",
            "--device",
            "dev-a",
            "--model",
            "mlp:9",
            "-o",
            str(tmp_path / "x.tar"),
        )
        assert unvalidated.returncode == 1 and "404" in unvalidated.stderr, unvalidated.stderr
        twice = {"device_id": "dev-a", "models": [{"model": "mlp", "version": 2}] * 2}
        with cp.client(op) as api:
            resp = api.post("/api/v1/bundles", json=twice)
        assert resp.status_code == 400 and "models: each model once" in resp.text, resp.text

        # tampered: the manifest's version changed under its signature; an artifact's bytes
        def forged(name: str, data: bytes) -> bytes:
            return data.replace(b'"version":2', b'"version":7') if name == DESIRED else data

        def damaged(name: str, data: bytes) -> bytes:
            return data if name == DESIRED else data[:-1] + bytes([data[-1] ^ 1])

        for change, code in ((forged, "bad_signature"), (damaged, "digest_mismatch")):
            bad = install(retarred(bundle, tmp_path / f"{code}.tar", change), state_dir)
            assert bad.returncode == 1, bad.stdout + bad.stderr
            assert f": refused: {code}: " in bad.stdout, bad.stdout
            assert served(agent) == "1"

        done = install(bundle, state_dir, command="agent")
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("mlp v2 (sequence ") and "committed" in done.stdout
        assert served(agent) == "2"

        replayed = install(bundle, state_dir)
        assert replayed.returncode == 1 and ": refused: replayed: " in replayed.stdout
        expired = install(expired_bundle(cp, bundle, tmp_path / "expired.tar"), state_dir)
        assert expired.returncode == 1 and ": refused: expired: " in expired.stdout
        assert served(agent) == "2"
        # an agent release bundles too; this agent runs under no launcher: refused so
        release = pack(tmp_path / "agent-2.0.0.tar.gz", "2.0.0").read_bytes()
        assert cp.admin.put("/api/v1/agent-releases/2.0.0", content=release).status_code == 201
        agent_bundle = tmp_path / "agent.bundle.tar"
        args = [
            "bundle",
            "create",
            "--device",
            "dev-a",
            "--agent",
            "2.0.0",
            "-o",
            str(agent_bundle),
        ]
        made_agent = edgefleet(cp, op, *args)
        assert made_agent.returncode == 0, made_agent.stderr
        assert "agent release 2.0.0 for dev-a" in made_agent.stdout
        no_launcher = install(agent_bundle, state_dir)
        assert no_launcher.returncode == 1, no_launcher.stdout + no_launcher.stderr
        assert "@agent (sequence 1): refused: no_launcher: " in no_launcher.stdout

        broker.start()  # back online: the outbox drains, the retained state agrees

        def seen() -> bool:
            evs = events(cp, "dev-a")
            committed = any(e["state"] == "committed" and e["version"] == 2 for e in evs)
            return committed and "expired" in {e.get("code") for e in evs}

        wait_until(seen, timeout_s=60, what="the install's events from dev-a")
        evs = events(cp, "dev-a")
        mine = [e for e in evs if e["version"] == 2 and e["rollout_id"] is None]
        assert {"received", "committed"} <= {e["state"] for e in mine}, evs
        refused_codes = {e.get("code") for e in evs if e["state"] == "rejected"}
        assert {"bad_signature", "digest_mismatch", "replayed", "expired"} <= refused_codes, evs

        def status() -> list[dict[str, Any]]:
            return cp.admin.get("/api/v1/devices/dev-a").json()["models"]  # type: ignore[no-any-return]

        wait_until(
            lambda: [(m["model"], m["version"]) for m in status()] == [("mlp", 2)],
            what="dev-a's status serving mlp v2",
        )
        shown = edgefleet(cp, op, "devices", "show", "dev-a")
        assert shown.returncode == 0, shown.stderr
        assert "  models         mlp v2" in shown.stdout.splitlines(), shown.stdout
        # the retained desired state names the bundle's version: nothing sent it back
        assert served(agent) == "2"
        assert not [e for e in events(cp, "dev-a") if e["version"] not in (None, 2)]
