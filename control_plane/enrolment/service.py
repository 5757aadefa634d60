"""The exchange: a device presents its claim token and a key of its own; it is refused, told
to wait for an operator, or given its broker identity and the trust root.

Devices enrolling at once are admitted in one transaction, and finished in another
(:mod:`control_plane.enrolment.intake`): the claim's uses are counted (and the enrolments
stored) before the broker is asked for their accounts; a device whose answer was lost (the
broker away, the connection cut) asks again with the same device key and gets the same password
(:class:`control_plane.enrolment.identity.DevicePasswords`), without taking another use."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from common.protocol.enrolment import EnrolmentAnswer, EnrolmentRequest, EnrolmentStatus
from control_plane.db.models import Enrolment
from control_plane.db.session import required_utc, stored_utc
from control_plane.db.states import EnrolmentState, Refusal
from control_plane.enrolment.accounts import BrokerAccounts
from control_plane.enrolment.batching import Batches
from control_plane.enrolment.claims import EnrolmentRefused, find_claim
from control_plane.enrolment.identity import DevicePasswords
from control_plane.enrolment.intake import Admitted, admit_batch, finish_batch
from control_plane.errors import Conflict, NotFound

log = logging.getLogger("edgefleet.control_plane.enrolment")
ADMIT_ATTEMPTS = 3
"""Tries of a batch's admission that lost a race for an enrolment row to another replica."""
KNOWN_CLAIMS_KEPT = 1000
"""Tokens remembered as good at most (then forgotten all at once: bogus tokens are not kept)."""


class Enroller:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        accounts: BrokerAccounts,
        *,
        topic_prefix: str,
        pending_retry_s: float,
        claim_check_cache_s: float = 0.0,
        max_batch: int = 500,
        passwords: DevicePasswords | None = None,
    ) -> None:
        """``passwords``: each device's, from its device key (None: a new random one at each
        request, so a device asking twice at once holds one that no longer works)."""
        self.sessions = sessions
        self.accounts = accounts
        self.passwords = passwords
        self.topic_prefix = topic_prefix
        self.pending_retry_s = pending_retry_s
        self.claim_check_cache_s = claim_check_cache_s
        self._known: dict[str, float] = {}
        self._lookups: dict[str, asyncio.Future[None]] = {}
        """Tokens found to be a claim's, and until when that is trusted (monotonic)."""
        self.admissions: Batches[tuple[str, EnrolmentRequest], Admitted] = Batches(
            self._admit_batch, max_batch=max_batch
        )
        self.completions: Batches[tuple[EnrolmentRequest, Admitted], dict[str, Any] | None] = (
            Batches(self._finish_batch, max_batch=max_batch)
        )

    async def check_claim(self, token: str) -> None:
        """Raise EnrolmentRefused (unknown_claim) unless ``token`` is a claim's, whatever its
        state: the route asks before it reads the body. A token found good is trusted for
        ``claim_check_cache_s`` (its state is checked again by :meth:`enrol`); requests
        presenting the same token meanwhile share one lookup."""
        if self._known.get(token, 0.0) > time.monotonic():
            return
        lookup = self._lookups.get(token)
        if lookup is None:
            lookup = asyncio.ensure_future(self._look_up(token))
            self._lookups[token] = lookup
            lookup.add_done_callback(lambda _: self._lookups.pop(token, None))
        await asyncio.shield(lookup)

    async def _look_up(self, token: str) -> None:
        async with self.sessions() as s:
            await find_claim(s, token)
        if self.claim_check_cache_s > 0:
            if len(self._known) >= KNOWN_CLAIMS_KEPT:
                self._known.clear()
            self._known[token] = time.monotonic() + self.claim_check_cache_s

    async def enrol(self, token: str, req: EnrolmentRequest) -> EnrolmentAnswer:
        """Exchange the claim ``token`` for ``req``'s device, in a batch with the devices
        enrolling meanwhile.

        Raises:
            EnrolmentRefused: the claim is unknown, expired, revoked or used up; the device is
                out of its scope, rejected, or another device's id.
        """
        admitted = await self.admissions.submit((token, req))
        if admitted.state is EnrolmentState.PENDING:
            return EnrolmentAnswer(
                device_id=req.device_id,
                status=EnrolmentStatus.PENDING,
                retry_after_s=self.pending_retry_s,
            )
        wanted = (
            self.passwords.for_device(req.device_id, req.device_key) if self.passwords else None
        )
        password = await self.accounts.issue(req.device_id, wanted)
        trust = await self.completions.submit((req, admitted))
        if trust is None:  # rejected while its account was made: that account goes too
            await self.accounts.remove(req.device_id)
            raise EnrolmentRefused(Refusal.REJECTED, "an operator rejected this device meanwhile")
        log.info("device enrolled", extra={"device_id": req.device_id, "claim": admitted.claim_id})
        return EnrolmentAnswer(
            device_id=req.device_id,
            status=EnrolmentStatus.ENROLLED,
            username=req.device_id,
            password=password,
            topic_prefix=self.topic_prefix,
            trust_root=trust,
        )

    async def _admit_batch(
        self, items: list[tuple[str, EnrolmentRequest]]
    ) -> list[Admitted | Exception]:
        """Each device id once a transaction: a device asking twice at once is admitted, then
        recognised."""
        firsts: dict[str, int] = {}
        for n, (_, req) in enumerate(items):
            firsts.setdefault(req.device_id, n)
        once = [items[n] for n in firsts.values()]
        for attempt in range(ADMIT_ATTEMPTS):
            try:
                async with self.sessions.begin() as s:
                    admitted = await admit_batch(s, once, datetime.now(UTC))
                break
            except IntegrityError:
                # another replica stored one of these enrolments meanwhile (the same device
                # asking at both): admitted again, it is recognised by its device key
                if attempt + 1 == ADMIT_ATTEMPTS:
                    raise
        answers = dict(zip(firsts.values(), admitted, strict=True))
        again = [n for n in range(len(items)) if n not in answers]
        if again:
            later = await self._admit_batch([items[n] for n in again])
            answers.update(zip(again, later, strict=True))
        return [answers[n] for n in range(len(items))]

    async def _finish_batch(
        self, items: list[tuple[EnrolmentRequest, Admitted]]
    ) -> list[dict[str, Any] | None | Exception]:
        for attempt in range(ADMIT_ATTEMPTS):
            try:
                async with self.sessions.begin() as s:
                    return list(await finish_batch(s, items, datetime.now(UTC)))
            except IntegrityError:
                # another replica put one of these devices in the inventory meanwhile (the
                # same device enrolling at both): again, it finds the row and updates it
                if attempt + 1 == ADMIT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

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
