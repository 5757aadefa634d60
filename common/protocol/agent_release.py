"""An agent release from the fleet: a signed manifest naming one artifact (a ``.tar.gz`` of a
release tree, agent/launcher/releases.py) by digest, with its own anti-rollback line.

Signed and verified as model manifests are (:func:`common.protocol.signing.verify_signed`,
the trust root's manifest keys). ``kind`` keeps the two apart: a model manifest has none and a
release manifest has no ``model``, so neither validates as the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from common.protocol.errors import ProtocolError, Rejection
from common.protocol.messages import FileRef, TargetSelector
from common.protocol.signing import Envelope, TrustRoot, parse_envelope, verify_signed
from common.protocol.verify import DeviceIdentity, _window

AGENT_VERSION_PATTERN = r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$"
"""A release version is also a folder name on the device: no separators, no leading dot."""


class AgentReleaseManifest(BaseModel):
    """What the fleet wants a device's launcher to put on trial. Signed."""

    model_config = ConfigDict(extra="ignore")  # signed bytes, not this model, are what is verified

    schema_version: Literal[1] = 1
    kind: Literal["agent_release"]
    version: str = Field(pattern=AGENT_VERSION_PATTERN)
    sequence: int = Field(ge=1)
    """Increasing across the fleet's agent releases; a device refuses one not newer than the
    last it installed (anti-rollback: an old release with a known hole is never sent back)."""
    artifact: FileRef
    """The release tree as a ``.tar.gz`` (its ``release.json`` names the same version)."""
    target: TargetSelector = Field(default_factory=TargetSelector)
    rollout_id: str | None = None
    issued_at: datetime
    expires_at: datetime

    @model_validator(mode="after")
    def _expiry_after_issue(self) -> AgentReleaseManifest:
        if self.issued_at.utcoffset() is None or self.expires_at.utcoffset() is None:
            raise ValueError("issued_at and expires_at need a time zone")
        if self.expires_at <= self.issued_at:
            raise ValueError("expires_at must be after issued_at")
        return self


@dataclass(frozen=True)
class VerifiedAgentRelease:
    manifest: AgentReleaseManifest
    signer: str
    envelope: Envelope


def verify_agent_release(
    raw: bytes | dict[str, Any],
    trust: TrustRoot,
    device: DeviceIdentity,
    floor: int | None,
    now: datetime,
) -> VerifiedAgentRelease:
    """Signature by a trusted, unrevoked manifest key; valid now; newer than ``floor`` (the
    sequence of the last release installed); targets this device.

    Raises:
        ProtocolError: with the reason's code; nothing may be installed.
    """
    envelope = parse_envelope(raw)
    signer = verify_signed(envelope, trust)
    try:
        manifest = AgentReleaseManifest.model_validate(envelope.signed)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProtocolError(Rejection.MALFORMED, f"agent release {where}: {first['msg']}") from None
    what = f"agent release {manifest.version} (sequence {manifest.sequence})"
    _window(manifest.issued_at, manifest.expires_at, now, what)
    if floor is not None and manifest.sequence <= floor:
        raise ProtocolError(
            Rejection.REPLAYED, f"{what} is not newer than sequence {floor} already installed"
        )
    why_not = manifest.target.matches(device.device_id, device.labels, device.profile)
    if why_not:
        raise ProtocolError(Rejection.WRONG_TARGET, f"{what}: {why_not}")
    return VerifiedAgentRelease(manifest, signer, envelope)
