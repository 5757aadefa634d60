"""A release from the fleet, installed only once verified: its signed manifest
(:func:`common.protocol.agent_release.verify_agent_release`: trust root, expiry, target and
anti-rollback), then its artifact's size and digest, then the version its ``release.json``
names. Any refusal raises :class:`ProtocolError` with its code and installs nothing.

The anti-rollback floor (the sequence of the last release installed) is ``release-floor.json``
in the launcher's root, raised after the install and before the release is put on trial, so a
kill -9 in between never lets an older manifest back in.
"""

from __future__ import annotations

import hashlib
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agent.launcher.journal import PendingRelease, save_pending
from agent.launcher.releases import ReleaseError, ReleaseInfo, Releases
from common.files import write_atomically
from common.protocol.agent_release import VerifiedAgentRelease, verify_agent_release
from common.protocol.errors import ProtocolError, Rejection
from common.protocol.signing import TrustRoot
from common.protocol.verify import DeviceIdentity


class ReleaseFloor(BaseModel):
    sequence: int


def floor_path(root: Path) -> Path:
    return root / "release-floor.json"


def load_floor(root: Path) -> int | None:
    path = floor_path(root)
    return ReleaseFloor.model_validate_json(path.read_bytes()).sequence if path.is_file() else None


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


def install_verified(
    envelope: bytes | dict[str, Any],
    artifact: Path,
    trust: TrustRoot,
    device: DeviceIdentity,
    root: Path,
    now: datetime,
) -> tuple[VerifiedAgentRelease, ReleaseInfo]:
    """Verify, install beside the others, raise the floor and ask for the trial."""
    verified = verify_agent_release(envelope, trust, device, load_floor(root), now)
    manifest = verified.manifest
    what = f"agent release {manifest.version}"
    size = artifact.stat().st_size
    if size != manifest.artifact.size:
        expected = manifest.artifact.size
        raise ProtocolError(
            Rejection.SIZE_MISMATCH, f"{what}: {size} bytes, the manifest says {expected}"
        )
    if _digest(artifact) != manifest.artifact.sha256:
        raise ProtocolError(Rejection.DIGEST_MISMATCH, f"{what}: its sha256 is not the manifest's")
    releases = Releases(root / "releases")
    try:
        info = releases.install(artifact)
    except ReleaseError as exc:
        raise ProtocolError(Rejection.MALFORMED, f"{what}: {exc}") from exc
    if info.version != manifest.version:
        shutil.rmtree(releases.path(info.version))
        raise ProtocolError(
            Rejection.MALFORMED, f"{what}: its release.json says version {info.version}"
        )
    write_atomically(
        floor_path(root), ReleaseFloor(sequence=manifest.sequence).model_dump_json().encode()
    )
    save_pending(root, PendingRelease(version=info.version))
    return verified, info
