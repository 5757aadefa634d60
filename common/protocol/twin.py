"""The config twin: the configuration the fleet wants one device to run, and what it runs.

The control plane merges the twins of the label groups a device belongs to and the device's
own (which wins, key by key), signs the result for that device, and sends it inside the
device's retained :class:`~common.protocol.messages.DesiredState` among the manifests (no new
topic: the broker's ACL is unchanged, a device still publishes only under its own topics).
``kind`` keeps it apart from manifests. The device verifies it as it verifies a manifest
(a trusted, unrevoked manifest key), refuses one for another device or older than the version
it applied (anti-rollback), and reports what it applied in its status as :class:`TwinReport`.

Which ``settings`` a device accepts, and which of them apply live, is the agent's to say
(``agent/fleet/twin.py``): the control plane passes names through, so a newer agent's settings
need no new control plane.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from common.protocol.errors import ProtocolError, Rejection
from common.protocol.signing import Envelope, TrustRoot, parse_envelope, verify_signed

TWIN_KIND = "config_twin"
TWIN_KEY = "@twin"
"""The twin's key in the control plane's per-device desired envelopes and in the device's
update events (no model can be called so)."""
KEY_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
MAX_APP_BYTES = 16 * 1024
"""The application keys, as canonical JSON, at most: a twin is configuration, not data."""


class ConfigTwin(BaseModel):
    """Signed, for one device."""

    model_config = ConfigDict(extra="ignore")  # signed bytes, not this model, are verified

    schema_version: Literal[1] = 1
    kind: Literal["config_twin"]
    device_id: str
    version: int = Field(ge=1)
    """Increasing per device; a device refuses a twin older than the one it applied."""
    settings: dict[str, Any] = Field(default_factory=dict)
    """Agent settings by name (``telemetry_interval_s``, ``log_level``...): checked by the
    device, which rejects an unknown name or a bad value with its reason and applies the rest."""
    app: dict[str, Any] = Field(default_factory=dict)
    """Free application keys, served to apps on the device by its local API."""
    issued_at: datetime

    @model_validator(mode="after")
    def _zoned(self) -> ConfigTwin:
        if self.issued_at.utcoffset() is None:
            raise ValueError("issued_at needs a time zone")
        return self


class TwinReport(BaseModel):
    """In the device's status: the twin it applied and how."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1)
    """The version of the twin last verified and applied."""
    reported: dict[str, Any] = Field(default_factory=dict)
    """The twin's settings as they are in effect now (a setting awaiting a restart shows its
    running value here), plus ``app``: the application keys served locally."""
    pending_restart: dict[str, Any] = Field(default_factory=dict)
    """Settings accepted that take effect at the agent's next start, with their new values."""
    rejected: dict[str, str] = Field(default_factory=dict)
    """Settings refused, with why (unknown name, bad value); the rest of the twin applied."""


def is_twin(raw: object) -> bool:
    """Whether a desired state's entry claims to be a twin (verified by :func:`verify_twin`)."""
    signed = raw.get("signed") if isinstance(raw, dict) else None
    return isinstance(signed, dict) and signed.get("kind") == TWIN_KIND


@dataclass(frozen=True)
class VerifiedTwin:
    twin: ConfigTwin
    signer: str
    envelope: Envelope


def verify_twin(
    raw: bytes | dict[str, Any], trust: TrustRoot, device_id: str, floor: int | None
) -> VerifiedTwin:
    """Signature by a trusted, unrevoked manifest key; for this device; not older than
    ``floor`` (the version applied; the same version again is the retained copy, the caller's
    to skip).

    Raises:
        ProtocolError: with the reason's code; nothing changes.
    """
    envelope = parse_envelope(raw)
    signer = verify_signed(envelope, trust)
    try:
        twin = ConfigTwin.model_validate(envelope.signed)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProtocolError(Rejection.MALFORMED, f"config twin {where}: {first['msg']}") from None
    if twin.device_id != device_id:
        raise ProtocolError(Rejection.WRONG_TARGET, f"config twin for device {twin.device_id}")
    if floor is not None and twin.version < floor:
        raise ProtocolError(
            Rejection.REPLAYED,
            f"config twin version {twin.version} is older than version {floor} applied",
        )
    return VerifiedTwin(twin, signer, envelope)
