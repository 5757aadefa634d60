"""The exchange: a device presents its claim token and a key of its own; it is refused, told
to wait for an operator, or given its broker identity and the trust root.

The claim's use is counted (and the enrolment stored) in one transaction before the broker is
asked for an account; a device whose answer was lost (the broker away, the connection cut)
asks again with the same device key and gets a new password, without taking another use."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from common.protocol.enrolment import EnrolmentAnswer, EnrolmentRequest, EnrolmentStatus
from control_plane.db.models import Claim, Device, Enrolment, TrustRootRecord
from control_plane.db.session import required_utc, stored_utc
from control_plane.enrolment.accounts import BrokerAccounts
from control_plane.enrolment.claims import (
    EnrolmentRefused,
    find_claim,
    key_hash,
    refuse_inactive,
    same_key,
    take_use,
)
from control_plane.enrolment.states import EnrolmentState, Refusal
from control_plane.errors import Conflict, NotFound
from control_plane.provisioning.acl import RESERVED_USERS

log = logging.getLogger("edgefleet.control_plane.enrolment")


class Enroller:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        accounts: BrokerAccounts,
        *,
        topic_prefix: str,
        pending_retry_s: float,
    ) -> None:
        self.sessions = sessions
        self.accounts = accounts
        self.topic_prefix = topic_prefix
        self.pending_retry_s = pending_retry_s

    async def check_claim(self, token: str) -> None:
        """Raise EnrolmentRefused (unknown_claim) unless ``token`` is a claim's, whatever its
        state: the route asks before it reads the body."""
        async with self.sessions() as s:
            await find_claim(s, token)

    async def enrol(self, token: str, req: EnrolmentRequest) -> EnrolmentAnswer:
        """Exchange the claim ``token`` for ``req``'s device.

        Raises:
            EnrolmentRefused: the claim is unknown, expired, revoked or used up; the device is
                out of its scope, rejected, or another device's id.
        """
        now = datetime.now(UTC)
        async with self.sessions.begin() as s:
            claim = await find_claim(s, token)
            row = await s.get(Enrolment, req.device_id)
            if row is None:
                row = await self._admit(s, claim, req, now)
            else:
                self._recognise(claim, row, req)
            state = EnrolmentState(row.state)
        if state is EnrolmentState.PENDING:
            return EnrolmentAnswer(
                device_id=req.device_id,
                status=EnrolmentStatus.PENDING,
                retry_after_s=self.pending_retry_s,
            )
        password = await self.accounts.issue(req.device_id)
        trust = None
        async with self.sessions.begin() as s:
            row = await s.get(Enrolment, req.device_id)
            if row is not None and row.state != EnrolmentState.REJECTED:
                await self._inventory(s, claim, req)
                row.state, row.issued_at = EnrolmentState.ENROLLED.value, now
                trust = await _trust_envelope(s)
        if trust is None:  # rejected while its account was made: that account goes too
            await self.accounts.remove(req.device_id)
            raise EnrolmentRefused(Refusal.REJECTED, "an operator rejected this device meanwhile")
        log.info("device enrolled", extra={"device_id": req.device_id, "claim": claim.id})
        return EnrolmentAnswer(
            device_id=req.device_id,
            status=EnrolmentStatus.ENROLLED,
            username=req.device_id,
            password=password,
            topic_prefix=self.topic_prefix,
            trust_root=trust,
        )

    async def _admit(
        self, s: AsyncSession, claim: Claim, req: EnrolmentRequest, now: datetime
    ) -> Enrolment:
        """A device presenting the claim for the first time: checked, counted, stored."""
        refuse_inactive(claim, now)
        if claim.profiles and req.hardware_profile not in claim.profiles:
            raise EnrolmentRefused(
                Refusal.OUT_OF_SCOPE,
                f"claim {claim.name!r} enrols profiles {claim.profiles}, "
                f"not {req.hardware_profile!r}",
            )
        if req.device_id in RESERVED_USERS or await s.get(Device, req.device_id) is not None:
            raise EnrolmentRefused(
                Refusal.DEVICE_EXISTS,
                f"device id {req.device_id!r} is taken in this fleet: choose another "
                "(fleet.device_id), or have an operator revoke the old one",
            )
        row = Enrolment(
            device_id=req.device_id,
            claim_id=claim.id,
            key_hash=key_hash(req.device_key),
            state=(
                EnrolmentState.PENDING if claim.require_approval else EnrolmentState.APPROVED
            ).value,
            hardware_profile=req.hardware_profile,
            labels=req.labels,
            reason="",
            requested_at=now,
        )
        s.add(row)
        await s.flush()
        # NOTE: the use last, just before the commit: its UPDATE locks the claim's row until
        # then, and every device presenting this claim waits for that lock (5,000 devices on
        # one claim: 35 a second with the use taken first, benchmarks/fleet/enrolment.py)
        await take_use(s, claim, now)
        return row

    @staticmethod
    def _recognise(claim: Claim, row: Enrolment, req: EnrolmentRequest) -> None:
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

    @staticmethod
    async def _inventory(s: AsyncSession, claim: Claim, req: EnrolmentRequest) -> None:
        """The device in the inventory, with the claim's labels as operator labels (so they
        win over what it reports, and its group is the claim's)."""
        device = await s.get(Device, req.device_id)
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
        device.hardware_profile = device.hardware_profile or req.hardware_profile
        device.operator_labels = {**claim.labels, **device.operator_labels}

    async def decide(self, device_id: str, *, approve: bool, user: str, reason: str) -> Enrolment:
        """Approve a pending device, or reject one in any state: one that collected a broker
        user loses it, and cannot collect another with its device key (rejecting it again
        deletes the user again, after a broker that could not be reached).

        Raises:
            NotFound: no such enrolment.
            Conflict: it is past that decision.
        """
        allowed = (
            {EnrolmentState.PENDING}
            if approve
            else set(EnrolmentState)  # again too: the broker user's deletion once more
        )
        async with self.sessions.begin() as s:
            row = await s.get(Enrolment, device_id)
            if row is None:
                raise NotFound(f"no enrolment of device {device_id!r}")
            if EnrolmentState(row.state) not in allowed:
                raise Conflict(
                    f"device {device_id!r} is {row.state}: it cannot be "
                    f"{'approved' if approve else 'rejected'} now"
                )
            enrolled = row.issued_at is not None  # it collected a broker user
            row.state = (EnrolmentState.APPROVED if approve else EnrolmentState.REJECTED).value
            row.decided_by, row.reason = user, reason
        if enrolled:
            await self.accounts.remove(device_id)
        return row

    async def list(self, state: EnrolmentState | None) -> list[Enrolment]:
        async with self.sessions() as s:
            query = select(Enrolment).order_by(Enrolment.requested_at)
            if state is not None:
                query = query.where(Enrolment.state == state.value)
            return list((await s.execute(query)).scalars())


def enrolment_doc(row: Enrolment) -> dict[str, Any]:
    return {
        "device_id": row.device_id,
        "claim_id": row.claim_id,
        "state": row.state,
        "hardware_profile": row.hardware_profile,
        "labels": row.labels,
        "reason": row.reason,
        "requested_at": required_utc(row.requested_at).isoformat(),
        "decided_by": row.decided_by,
        "issued_at": stored_utc(row.issued_at).isoformat() if row.issued_at else None,
    }


async def _trust_envelope(s: AsyncSession) -> dict[str, Any]:
    record = (
        await s.execute(select(TrustRootRecord).order_by(TrustRootRecord.version.desc()).limit(1))
    ).scalar_one_or_none()
    if record is None:
        raise NotFound("no trust root yet: the control plane creates it at its first start")
    return record.envelope
