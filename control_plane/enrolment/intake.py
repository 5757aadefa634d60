"""The exchange's database work, per batch of devices enrolling at once: a handful of
statements a batch, not a dozen a device (benchmarks/fleet/enrolment.py).

Admitting a batch reads its claims, enrolments and inventory rows in one statement each, counts
each claim's uses in one ``UPDATE`` (the database's own check: never past ``max_uses``, in
this process or another), and stores the new enrolments in one ``INSERT``. Finishing a batch
(after the broker accounts were made) reads the enrolments again (an operator may have rejected
one meanwhile), writes the inventory rows and the trust root is read once for all."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from common.protocol.enrolment import EnrolmentRequest
from control_plane.db.models import Claim, Device, Enrolment, TrustRootRecord
from control_plane.db.states import EnrolmentState, Refusal
from control_plane.enrolment.claims import (
    EnrolmentRefused,
    claims_of,
    key_hash,
    refuse_inactive,
    same_key,
    take_uses,
)
from control_plane.errors import NotFound
from control_plane.provisioning.acl import RESERVED_USERS


@dataclass(frozen=True)
class Admitted:
    """A device's enrolment as its batch left it."""

    state: EnrolmentState
    claim_id: str
    claim_labels: dict[str, str] = field(default_factory=dict)


UNKNOWN = "the claim token is not known here"


async def admit_batch(
    s: AsyncSession, items: list[tuple[str, EnrolmentRequest]], now: datetime
) -> list[Admitted | Exception]:
    """Admit ``items`` (claim token, request), each device id once, in one transaction."""
    claims = await claims_of(s, [token for token, _ in items])
    ids = [req.device_id for _, req in items]
    rows = {
        r.device_id: r
        for r in (await s.execute(select(Enrolment).where(Enrolment.device_id.in_(ids)))).scalars()
    }
    taken = set((await s.execute(select(Device.id).where(Device.id.in_(ids)))).scalars())
    results: list[Admitted | Exception | None] = [None] * len(items)
    new: dict[str, list[int]] = {}  # claim id -> the items presenting it first
    by_id: dict[str, Claim] = {}
    for n, (token, req) in enumerate(items):
        claim = claims.get(token)
        try:
            if claim is None:
                raise EnrolmentRefused(Refusal.UNKNOWN_CLAIM, UNKNOWN)
            row = rows.get(req.device_id)
            if row is not None:
                recognise(claim, row, req)
                results[n] = Admitted(EnrolmentState(row.state), claim.id, dict(claim.labels))
                continue
            check_new(claim, req, now, taken)
        except EnrolmentRefused as exc:
            results[n] = exc
            continue
        new.setdefault(claim.id, []).append(n)
        by_id[claim.id] = claim
    for claim_id, waiting in new.items():
        claim = by_id[claim_id]
        try:
            granted = await take_uses(s, claim, len(waiting), now)
        except EnrolmentRefused as exc:
            granted, refusal = 0, exc
        else:
            refusal = EnrolmentRefused(Refusal.CLAIM_USED_UP, f"claim {claim.name!r} is used up")
        state = EnrolmentState.PENDING if claim.require_approval else EnrolmentState.APPROVED
        for n in waiting[granted:]:
            results[n] = refusal
        for n in waiting[:granted]:
            req = items[n][1]
            s.add(
                Enrolment(
                    device_id=req.device_id,
                    claim_id=claim.id,
                    key_hash=key_hash(req.device_key),
                    state=state.value,
                    hardware_profile=req.hardware_profile,
                    labels=req.labels,
                    reason="",
                    requested_at=now,
                )
            )
            results[n] = Admitted(state, claim.id, dict(claim.labels))
    return [r if r is not None else RuntimeError("not admitted") for r in results]


def check_new(claim: Claim, req: EnrolmentRequest, now: datetime, taken: set[str]) -> None:
    """A device presenting the claim for the first time: the claim active, the device in its
    scope, its id free."""
    refuse_inactive(claim, now)
    if claim.profiles and req.hardware_profile not in claim.profiles:
        raise EnrolmentRefused(
            Refusal.OUT_OF_SCOPE,
            f"claim {claim.name!r} enrols profiles {claim.profiles}, not {req.hardware_profile!r}",
        )
    if req.device_id in RESERVED_USERS or req.device_id in taken:
        raise EnrolmentRefused(
            Refusal.DEVICE_EXISTS,
            f"device id {req.device_id!r} is taken in this fleet: choose another "
            "(fleet.device_id), or have an operator revoke the old one",
        )


def recognise(claim: Claim, row: Enrolment, req: EnrolmentRequest) -> None:
    """A device asking again: the same key and claim, a claim not revoked, not rejected."""
    if claim.id != row.claim_id or not same_key(row.key_hash, req.device_key):
        raise EnrolmentRefused(
            Refusal.DEVICE_KEY_MISMATCH,
            f"device id {req.device_id!r} was enrolled by another device key",
        )
    if claim.revoked:
        raise EnrolmentRefused(Refusal.CLAIM_REVOKED, f"claim {claim.name!r} was revoked")
    if row.state == EnrolmentState.REJECTED:
        raise EnrolmentRefused(
            Refusal.REJECTED, f"an operator rejected this device: {row.reason or 'no reason'}"
        )


async def finish_batch(
    s: AsyncSession, items: list[tuple[EnrolmentRequest, Admitted]], now: datetime
) -> list[dict[str, Any] | None]:
    """Mark ``items`` enrolled and put them in the inventory, with their claim's labels as
    operator labels (so they win over what they report); each one's trust root envelope, or
    None: rejected meanwhile."""
    ids = [req.device_id for req, _ in items]
    rows = {
        r.device_id: r
        for r in (await s.execute(select(Enrolment).where(Enrolment.device_id.in_(ids)))).scalars()
    }
    devices = {
        d.id: d for d in (await s.execute(select(Device).where(Device.id.in_(ids)))).scalars()
    }
    trust = await trust_envelope(s)
    results: list[dict[str, Any] | None] = []
    for req, admitted in items:
        row = rows.get(req.device_id)
        if row is None or row.state == EnrolmentState.REJECTED:
            results.append(None)
            continue
        device = devices.get(req.device_id)
        if device is None:
            device = Device(
                id=req.device_id,
                desired={},
                models=[],
                online=False,
                reported_labels=dict(req.labels),
                operator_labels={},
            )
            s.add(device)
            devices[req.device_id] = device
        device.hardware_profile = device.hardware_profile or req.hardware_profile
        device.operator_labels = {**admitted.claim_labels, **(device.operator_labels or {})}
        row.state, row.issued_at = EnrolmentState.ENROLLED.value, now
        results.append(trust)
    return results


async def trust_envelope(s: AsyncSession) -> dict[str, Any]:
    record = (
        await s.execute(select(TrustRootRecord).order_by(TrustRootRecord.version.desc()).limit(1))
    ).scalar_one_or_none()
    if record is None:
        raise NotFound("no trust root yet: the control plane creates it at its first start")
    return record.envelope
