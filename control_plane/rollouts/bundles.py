"""Offline bundles (:mod:`common.protocol.bundle`): the signed manifests of some model versions
(and an agent release) for one device, and the artifact files they name, for a site without an
uplink.

Making one is a deployment to that device by other means: each manifest takes the model's next
sequence (so the device's anti-rollback floor moves as for any update) and becomes the device's
desired manifest for that model. The retained desired state then names what the bundle
installs: when the device next connects it finds it already applied, and the control plane does
not send it back to the version it served before.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from common.protocol.messages import DesiredState
from control_plane.db.models import AGENT_KEY, Device, Model, Rollout, RolloutDevice
from control_plane.db.states import ACTIVE
from control_plane.errors import Busy, Conflict, Invalid, NotFound
from control_plane.registry.agent_releases import get_release
from control_plane.registry.store import ArtifactStore, get_version
from control_plane.rollouts.agent import build_agent_manifest, for_agent_device
from control_plane.rollouts.manifests import build_manifest, for_device
from control_plane.rollouts.sending import Sign


class BundleModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=128)
    version: int = Field(ge=1, le=2**31 - 1)


class BundleSpec(BaseModel):
    """``POST /api/v1/bundles``: which versions, for which device."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    device_id: str = Field(min_length=1, max_length=128)
    """The device that installs it: its manifests target this device alone."""
    models: list[BundleModel] = Field(default_factory=list, max_length=32)
    agent_version: str | None = Field(default=None, min_length=1, max_length=64)
    """An agent release to bundle too (the device installs it under its launcher)."""
    ttl_s: float | None = Field(default=None, gt=0, le=366 * 86400)
    """How long the bundle stays installable (default: the control plane's manifest_ttl_s)."""


async def _refuse_busy(session: AsyncSession, device_id: str, model: str) -> None:
    """A rollout still acting on the device for ``model`` would overwrite what the bundle
    records: refused, as a second rollout of the model to that device would be."""
    held = await session.execute(
        select(Rollout.id)
        .join(RolloutDevice, RolloutDevice.rollout_id == Rollout.id)
        .where(
            RolloutDevice.device_id == device_id,
            Rollout.model == model,
            Rollout.state.in_(ACTIVE),
        )
        .limit(1)
    )
    rollout_id = held.scalar_one_or_none()
    if rollout_id is not None:
        raise Busy(f"rollout {rollout_id} of {model} holds device {device_id}; end it first")


async def plan_bundle(
    session: AsyncSession,
    spec: BundleSpec,
    store: ArtifactStore,
    *,
    sign: Sign,
    artifact_base_url: str,
    ttl_s: float,
) -> tuple[Device, DesiredState, dict[str, Path]]:
    """The device, the desired state the bundle carries and its files (digest -> path), in
    ``session``'s transaction (which records each manifest as the device's desired one).

    Raises:
        Invalid: nothing named, or a model named twice. NotFound: no such device, or version.
        Conflict: a version not validated, or failed.
        Busy: an active rollout of the model holds the device.
    """
    if not spec.models and spec.agent_version is None:
        raise Invalid("models: name a model version, or an agent_version")
    names = [m.model for m in spec.models]
    if len(set(names)) != len(names):
        raise Invalid(f"models: each model once (a device serves one version of each): {names}")
    device = await session.get(Device, spec.device_id)
    if device is None:
        raise NotFound(f"no device {spec.device_id}")
    now = datetime.now(UTC)
    signed: dict[str, dict[str, Any]] = {}
    files: dict[str, Path] = {}
    for item in spec.models:
        mv = await get_version(session, item.model, item.version)
        report = mv.validation
        if report is None or not report.get("passed"):
            raise Conflict(f"{item.model} v{item.version} is not validated; validate it first")
        await _refuse_busy(session, device.id, item.model)
        model = (
            await session.execute(select(Model).where(Model.name == item.model).with_for_update())
        ).scalar_one()
        sequence = model.next_sequence
        model.next_sequence += 1
        manifest = build_manifest(
            mv,
            sequence=sequence,
            base_url=artifact_base_url,
            rollout_id=None,
            now=now,
            ttl_s=ttl_s,
        )
        manifest = for_device(manifest, device.id, now, ttl_s)
        signed[item.model] = sign(manifest)
        refs = [f for v in manifest.artifacts for f in v.files]
        for ref in [*refs, *([manifest.golden] if manifest.golden else [])]:
            files[ref.sha256] = store.path(ref.sha256)
    if spec.agent_version is not None:
        release = await get_release(session, spec.agent_version)
        await _refuse_busy(session, device.id, AGENT_KEY)
        agent = build_agent_manifest(
            release, base_url=artifact_base_url, rollout_id=None, now=now, ttl_s=ttl_s
        )
        signed[AGENT_KEY] = sign(for_agent_device(agent, device.id, now, ttl_s))
        files[release.sha256] = store.path(release.sha256)
    device.desired = {**device.desired, **signed}
    desired = DesiredState(device_id=device.id, issued_at=now, manifests=list(signed.values()))
    return device, desired, files
