"""Manifests from registry versions (the control plane signs them with its manifest key)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from control_plane.db.models import ModelVersion


def _file(ref: dict[str, Any], base_url: str) -> dict[str, Any]:
    return {
        "name": ref["name"],
        "sha256": ref["sha256"],
        "size": ref["size"],
        "url": f"{base_url}/artifacts/sha256/{ref['sha256']}",
    }


def build_manifest(
    mv: ModelVersion,
    *,
    sequence: int,
    base_url: str,
    target: dict[str, Any],
    rollout_id: str | None,
    ttl_s: float,
) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "schema_version": 1,
        "model": mv.model.name,
        "version": mv.version,
        "sequence": sequence,
        "artifacts": [
            {
                "format": v["format"],
                "profiles": v["profiles"],
                "files": [_file(f, base_url) for f in v["files"]],
            }
            for v in mv.variants
        ],
        "golden": _file(mv.golden, base_url) if mv.golden else None,
        "config": mv.config,
        "health": mv.health,
        "target": target,
        "rollout_id": rollout_id,
        "issued_at": now.isoformat(),
        "expires_at": (now + timedelta(seconds=ttl_s)).isoformat(),
    }
