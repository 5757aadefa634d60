"""An agent release rolled out with the model rollouts' machinery: the same waves, windows,
pause, abort and rollback, with what differs kept here.

- Its manifest is an :class:`~common.protocol.agent_release.AgentReleaseManifest`, stored on the
  rollout and signed for each device into ``Device.desired[AGENT_KEY]`` (a key no model name
  can take), beside the device's model manifests.
- A device whose status carries no launcher report cannot update itself: its row is rejected
  (``no_launcher``) when its wave starts, and the wave is judged as for a refusal.
- A device's row moves from what its status says of its launcher (:func:`reconcile_agent`):
  committed when the launcher's last trial committed the release, rolled back (with the
  launcher's reason) when it went back; reverted, on a rollback, once the release no longer
  runs there.
- The wave's telemetry gates are not judged (the launcher's trial is the gate).

Rolling back restores each device's previous desired release manifest; a device that had
none keeps the release it committed (the fleet holds no earlier release to send it), as the
gate report and the device's row say.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from common.protocol.agent_release import AgentReleaseManifest
from common.protocol.errors import Rejection
from common.protocol.messages import AgentReleaseOutcome, FileRef, LauncherReport, TargetSelector
from control_plane.db.models import AgentRelease, Device, Rollout, RolloutDevice
from control_plane.db.states import DeviceRolloutState

NO_LAUNCHER = (
    f"{Rejection.NO_LAUNCHER.value}: the device's status has no launcher report: its agent "
    "does not run under `edgefleet launcher run`, so it cannot update itself"
)
KEPT = "keeps the release it committed: no earlier fleet release to restore there"
UNJUDGED = "an agent release is judged by each device's launcher trial, not by telemetry"


def is_agent(rollout: Rollout) -> bool:
    return rollout.agent_version is not None


def build_agent_manifest(
    release: AgentRelease, *, base_url: str, rollout_id: str | None, now: datetime, ttl_s: float
) -> AgentReleaseManifest:
    """The release's manifest for no device in particular (see :func:`for_agent_device`)."""
    return AgentReleaseManifest(
        kind="agent_release",
        version=release.version,
        sequence=release.sequence,
        artifact=FileRef(
            name=f"agent-{release.version}.tar.gz",
            sha256=release.sha256,
            size=release.size,
            url=f"{base_url}/artifacts/sha256/{release.sha256}",
        ),
        rollout_id=rollout_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
    )


def for_agent_device(
    stored: dict[str, Any] | AgentReleaseManifest, device_id: str, now: datetime, ttl_s: float
) -> AgentReleaseManifest:
    """The rollout's stored manifest for one device, dated ``now``."""
    base = (
        stored
        if isinstance(stored, AgentReleaseManifest)
        else AgentReleaseManifest.model_validate(stored)
    )
    return base.model_copy(
        update={
            "target": TargetSelector(device_ids=[device_id]),
            "issued_at": now,
            "expires_at": now + timedelta(seconds=ttl_s),
        }
    )


def launcher_of(device: Device) -> LauncherReport | None:
    return LauncherReport.model_validate(device.launcher) if device.launcher else None


def reconcile_agent(rollout: Rollout, rd: RolloutDevice, device: Device, now: datetime) -> None:
    """Move ``rd`` from what ``device``'s status says of its launcher."""
    report = launcher_of(device)
    if report is None:
        return
    version = rollout.agent_version
    last = report.last_update
    if rd.state is DeviceRolloutState.SENT and last is not None and last.version == version:
        if last.outcome is AgentReleaseOutcome.COMMITTED and report.release == version:
            rd.state, rd.reason = DeviceRolloutState.COMMITTED, "the launcher committed it"
        elif last.outcome is AgentReleaseOutcome.ROLLED_BACK:
            rd.state = DeviceRolloutState.ROLLED_BACK
            rd.reason = f"rolled_back: {last.reason or 'failed its trial'}"
        else:
            return
        rd.updated_at = now
    elif rd.state is DeviceRolloutState.REVERTING and report.release != version:
        rd.state, rd.reason = DeviceRolloutState.REVERTED, f"runs {report.release} again"
        rd.updated_at = now
