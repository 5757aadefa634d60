"""Everything a device checks before it acts on a manifest or command, in order.

Any failure raises :class:`ProtocolError` with its code, and nothing changes on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from common.protocol.errors import ProtocolError, Rejection
from common.protocol.messages import ArtifactVariant, Command, ModelManifest
from common.protocol.signing import Envelope, TrustRoot, parse_envelope, verify_signed

CLOCK_SKEW = timedelta(minutes=5)
"""Tolerance for a device clock behind or ahead of the control plane's (edge clocks drift)."""


@dataclass(frozen=True)
class DeviceIdentity:
    device_id: str
    profile: str
    labels: dict[str, str] = field(default_factory=dict)
    formats: frozenset[str] = frozenset()
    """Model formats some runtime on this device can run."""


@dataclass(frozen=True)
class VerifiedManifest:
    manifest: ModelManifest
    variant: ArtifactVariant
    signer: str
    envelope: Envelope


def _window(issued_at: datetime, expires_at: datetime, now: datetime, what: str) -> None:
    if now > expires_at + CLOCK_SKEW:
        raise ProtocolError(Rejection.EXPIRED, f"{what} expired at {expires_at.isoformat()}")
    if issued_at > now + CLOCK_SKEW:
        raise ProtocolError(
            Rejection.NOT_YET_VALID, f"{what} is issued at {issued_at.isoformat()}, in the future"
        )


def claimed(signed: object) -> tuple[str | None, int | None]:
    """The model and sequence a manifest's signed part names, where they have the right type:
    so a refusal reaches the rollout it belongs to."""
    if not isinstance(signed, dict):
        return None, None
    model, sequence = signed.get("model"), signed.get("sequence")
    return (
        model if isinstance(model, str) else None,
        sequence if type(sequence) is int else None,
    )


def verify_window(manifest: ModelManifest, now: datetime) -> None:
    """Raise EXPIRED or NOT_YET_VALID unless ``now`` is within the manifest's validity window:
    checked on receipt, and again before an update deferred by a transient fault is retried."""
    what = f"manifest {manifest.model} v{manifest.version} (sequence {manifest.sequence})"
    try:
        _window(manifest.issued_at, manifest.expires_at, now, what)
    except ProtocolError as exc:
        raise ProtocolError(
            exc.code, exc.message, model=manifest.model, sequence=manifest.sequence
        ) from None


def verify_manifest(
    raw: bytes | dict[str, Any],
    trust: TrustRoot,
    device: DeviceIdentity,
    last_sequence: Callable[[str], int | None],
    now: datetime,
) -> VerifiedManifest:
    """Signature by a trusted, unrevoked key; not expired; newer than the last applied sequence
    for that model; targets this device; has an artifact this device can use."""
    envelope = parse_envelope(raw)
    # What the manifest claims to be, for the report only: it changes nothing.
    claimed_model, claimed_seq = claimed(envelope.signed)
    try:
        signer = verify_signed(envelope, trust)
    except ProtocolError as exc:
        raise ProtocolError(
            exc.code, exc.message, model=claimed_model, sequence=claimed_seq
        ) from None
    try:
        manifest = ModelManifest.model_validate(envelope.signed)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ProtocolError(
            Rejection.MALFORMED,
            f"manifest {'.'.join(str(p) for p in first['loc'])}: {first['msg']}",
            model=claimed_model,
            sequence=claimed_seq,
        ) from None
    what = f"manifest {manifest.model} v{manifest.version} (sequence {manifest.sequence})"
    model, sequence = manifest.model, manifest.sequence
    verify_window(manifest, now)
    floor = last_sequence(manifest.model)
    if floor is not None and manifest.sequence <= floor:
        raise ProtocolError(
            Rejection.REPLAYED,
            f"{what} is not newer than sequence {floor} already applied",
            model=model,
            sequence=sequence,
        )
    why_not = manifest.target.matches(device.device_id, device.labels, device.profile)
    if why_not:
        raise ProtocolError(
            Rejection.WRONG_TARGET, f"{what}: {why_not}", model=model, sequence=sequence
        )
    variant = manifest.variant_for(device.profile, set(device.formats))
    if variant is None:
        formats = sorted({v.format for v in manifest.artifacts})
        raise ProtocolError(
            Rejection.NO_ARTIFACT,
            f"{what} has no artifact for profile {device.profile} (formats {formats})",
            model=model,
            sequence=sequence,
        )
    return VerifiedManifest(manifest, variant, signer, envelope)


def verify_command(
    raw: bytes | dict[str, Any], trust: TrustRoot, device_id: str, now: datetime
) -> Command:
    envelope = parse_envelope(raw)
    verify_signed(envelope, trust)
    try:
        command = Command.model_validate(envelope.signed)
    except ValidationError as exc:
        raise ProtocolError(Rejection.MALFORMED, f"command: {exc.errors()[0]['msg']}") from None
    if command.device_id != device_id:
        raise ProtocolError(Rejection.WRONG_TARGET, f"command for device {command.device_id}")
    _window(command.issued_at, command.expires_at, now, f"command {command.command_id}")
    return command
