"""Manifests and commands from registry versions, built as the wire's own types
(:class:`~common.protocol.messages.ModelManifest`, :class:`~common.protocol.messages.Command`)
that every device parses; the control plane signs them with its manifest key."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from common.protocol.messages import (
    ArtifactVariant,
    Command,
    CommandType,
    FileRef,
    HealthCriteria,
    ModelManifest,
    TargetSelector,
)
from control_plane.db.models import ModelVersion


def _file(ref: dict[str, Any], base_url: str) -> FileRef:
    return FileRef(
        name=ref["name"],
        sha256=ref["sha256"],
        size=ref["size"],
        url=f"{base_url}/artifacts/sha256/{ref['sha256']}",
    )


def build_manifest(
    mv: ModelVersion,
    *,
    sequence: int,
    base_url: str,
    rollout_id: str | None,
    now: datetime,
    ttl_s: float,
) -> ModelManifest:
    """The manifest of ``mv`` for no device in particular (see :func:`for_device`).

    When a variant carries its own golden sample (an INT8 or FP16 one built by
    :mod:`control_plane.quality`), the version's goes into every other variant's files instead
    of the manifest's ``golden``: a device installs its variant's files by name, so each runs
    the golden sample made for what it serves."""
    golden = mv.golden
    variants = [dict(v) for v in mv.variants]
    if golden and any(f["name"] == golden["name"] for v in variants for f in v["files"]):
        for v in variants:
            if not any(f["name"] == golden["name"] for f in v["files"]):
                v["files"] = [*v["files"], golden]
        golden = None
    return ModelManifest(
        model=mv.model.name,
        version=mv.version,
        sequence=sequence,
        artifacts=[
            ArtifactVariant(
                format=v["format"],
                profiles=v["profiles"],
                files=[_file(f, base_url) for f in v["files"]],
            )
            for v in variants
        ],
        golden=_file(golden, base_url) if golden else None,
        config=mv.config,
        health=HealthCriteria.model_validate(mv.health),
        target=TargetSelector(),
        rollout_id=rollout_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
    )


def for_device(
    stored: dict[str, Any] | ModelManifest,
    device_id: str,
    now: datetime,
    ttl_s: float,
    *,
    activate_after: datetime | None = None,
) -> ModelManifest:
    """A rollout's stored manifest for one device, dated ``now``: a wave started or resumed
    weeks after the rollout's creation must not send a manifest past its expiry.
    ``activate_after``: when its maintenance window opens (it downloads ahead). ``stored``
    validated once (a :class:`ModelManifest`) serves a whole wave."""
    base = stored if isinstance(stored, ModelManifest) else ModelManifest.model_validate(stored)
    return base.model_copy(
        update={
            "target": TargetSelector(device_ids=[device_id]),
            "issued_at": now,
            "expires_at": now + timedelta(seconds=ttl_s),
            "activate_after": activate_after,
        }
    )


def rollback_command(
    device_id: str, model: str, from_version: int, reason: str, now: datetime, ttl_s: float
) -> Command:
    """Roll ``model`` back on ``device_id`` if it runs ``from_version``."""
    return Command(
        command_id=uuid.uuid4().hex,
        device_id=device_id,
        type=CommandType.ROLLBACK,
        model=model,
        from_version=from_version,
        reason=reason,
        issued_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
    )
