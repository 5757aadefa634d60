"""Agent releases in the registry: a release tree's ``.tar.gz`` (common/release_tree.py) stored
by digest in the artifact store the model versions use, with a version (the one its
``release.json`` names) and the next fleet-wide sequence (the devices' anti-rollback line).
A release is immutable: the same version again is a conflict, push a newer one."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from common.protocol.agent_release import AGENT_VERSION_PATTERN
from common.release_tree import ReleaseTreeError, read_version
from control_plane.db.models import AgentRelease
from control_plane.db.session import stored_utc
from control_plane.errors import Conflict, Invalid, NotFound, Unprocessable
from control_plane.registry.store import ArtifactStore, record_artifact


def check_version(version: str) -> None:
    """Raises: Invalid naming ``version`` when it is no release version."""
    if not re.fullmatch(AGENT_VERSION_PATTERN, version):
        raise Invalid(
            f"version: {version!r} is not a release version (letters, digits, '.', '+', '_', "
            "'-', at most 64, not starting with a separator)"
        )


async def get_release(session: AsyncSession, version: str) -> AgentRelease:
    row = await session.execute(select(AgentRelease).where(AgentRelease.version == version))
    release = row.scalar_one_or_none()
    if release is None:
        raise NotFound(f"no agent release {version!r}")
    return release


async def add_release(
    session: AsyncSession,
    store: ArtifactStore,
    version: str,
    sha: str,
    size: int,
    *,
    user: str,
    description: str = "",
) -> AgentRelease:
    """Record the stored tarball ``sha`` as release ``version``, with the next sequence.

    Raises:
        Invalid: ``version`` is no release version.
        Unprocessable: the tarball is no release tree, or its ``release.json`` names another
            version.
        Conflict: ``version`` is in the registry already.
    """
    check_version(version)
    try:
        named = await asyncio.to_thread(read_version, store.path(sha))
    except ReleaseTreeError as exc:
        raise Unprocessable(f"file: {exc}") from None
    if named != version:
        raise Unprocessable(
            f"file: its release.json names version {named!r}, not {version!r}; push it as "
            f"{named} or rebuild it"
        )
    existing = await session.execute(select(AgentRelease).where(AgentRelease.version == version))
    if existing.scalar_one_or_none() is not None:
        raise Conflict(f"agent release {version} exists and is immutable; push a newer one")
    last = (await session.execute(select(func.max(AgentRelease.sequence)))).scalar_one()
    await record_artifact(session, sha, size)
    release = AgentRelease(
        version=version,
        sequence=(last or 0) + 1,  # a concurrent push takes it first: unique, a 409
        sha256=sha,
        size=size,
        description=description,
        uploaded_by=user,
        created_at=datetime.now(UTC),
    )
    session.add(release)
    await session.flush()
    return release


async def list_releases(session: AsyncSession) -> list[AgentRelease]:
    rows = await session.execute(select(AgentRelease).order_by(AgentRelease.sequence))
    return list(rows.scalars())


def release_doc(release: AgentRelease) -> dict[str, Any]:
    return {
        "version": release.version,
        "sequence": release.sequence,
        "sha256": release.sha256,
        "size": release.size,
        "description": release.description,
        "uploaded_by": release.uploaded_by,
        "created_at": stored_utc(release.created_at).isoformat(),
    }
