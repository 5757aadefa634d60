"""A claim's uses under concurrency, on real PostgreSQL: devices enrolling at once through two
enrollers (two replicas' worth: each its own connection pool and batches) never take more
than ``max_uses``; a device asking twice at once is admitted once; approval still pends; a
revoked claim admits no one."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sqlalchemy import func, select

from common.protocol.enrolment import EnrolmentRequest, EnrolmentStatus
from control_plane.db.models import Claim, Enrolment, TrustRootRecord
from control_plane.db.session import make_engine, migrate, session_factory
from control_plane.db.states import Refusal
from control_plane.enrolment.claims import ClaimSpec, EnrolmentRefused, create_claim
from control_plane.enrolment.service import Enroller
from tests.control_plane.enrolment.conftest import postgresql_database


class Accounts:
    """Broker accounts kept in memory: the broker is not what this test is about."""

    def __init__(self) -> None:
        self.issued: list[str] = []

    async def issue(self, device_id: str, password: str | None = None) -> str:
        await asyncio.sleep(0.01)  # as a batch's write: others queue meanwhile
        self.issued.append(device_id)
        return f"pw-{device_id}-{len(self.issued)}"

    async def remove(self, device_id: str) -> None:
        self.issued.remove(device_id)


def request(device_id: str, key: str = "k") -> EnrolmentRequest:
    return EnrolmentRequest(
        device_id=device_id, device_key=f"{key}-of-{device_id}-" + "x" * 32, hardware_profile="p"
    )


async def outcome(enroller: Enroller, token: str, req: EnrolmentRequest) -> str:
    try:
        return (await enroller.enrol(token, req)).status.value
    except EnrolmentRefused as exc:
        return exc.reason.value


async def scenario(url: str) -> None:
    engines = [make_engine(url), make_engine(url)]
    try:
        sessions = [session_factory(e) for e in engines]
        async with sessions[0].begin() as s:
            now = datetime.now(UTC)
            s.add(TrustRootRecord(version=1, envelope={"signed": {"version": 1}}, created_at=now))
            _, token = await create_claim(s, ClaimSpec(name="few", max_uses=7), "op")
            _, pending = await create_claim(
                s, ClaimSpec(name="ask", max_uses=5, require_approval=True), "op"
            )
            revoked, gone = await create_claim(s, ClaimSpec(name="gone", max_uses=5), "op")
            revoked.revoked = True
        accounts = Accounts()
        enrollers = [
            Enroller(sx, accounts, topic_prefix="edgefleet", pending_retry_s=1.0, max_batch=8)
            for sx in sessions
        ]
        checks = await asyncio.gather(
            *(enrollers[0].check_claim(t) for t in [token] * 5 + ["efc_00_bogus"] * 5),
            return_exceptions=True,
        )
        assert checks[:5] == [None] * 5
        assert {e.reason for e in checks[5:] if isinstance(e, EnrolmentRefused)} == {
            Refusal.UNKNOWN_CLAIM
        }
        assert len([e for e in checks[5:] if isinstance(e, EnrolmentRefused)]) == 5
        reqs = [request(f"dev-{i:02d}") for i in range(40)]
        reqs += [request("dev-00"), request("dev-01", key="other")]  # twice at once
        results = await asyncio.gather(
            *(outcome(enrollers[n % 2], token, r) for n, r in enumerate(reqs)),
            outcome(enrollers[0], pending, request("asks")),
            outcome(enrollers[1], gone, request("late")),
        )
        *by_device, asked, late = results
        assert asked == EnrolmentStatus.PENDING.value
        assert late == Refusal.CLAIM_REVOKED.value
        async with sessions[1]() as s:
            uses = (await s.execute(select(Claim.uses).where(Claim.name == "few"))).scalar_one()
            stored = (await s.execute(select(func.count()).select_from(Enrolment))).scalar_one()
        assert uses == 7
        assert stored == 7 + 1  # the pending device is stored too
        first = {r.device_id: res for r, res in zip(reqs[:40], by_device[:40], strict=True)}
        admitted = {d for d, res in first.items() if res == "enrolled"}
        assert len(admitted) == 7 and set(accounts.issued) == admitted
        assert set(first.values()) == {"enrolled", Refusal.CLAIM_USED_UP.value}
        # the same device again at once: recognised (its key) or refused as it was
        assert by_device[40] == first["dev-00"]
        mismatch = Refusal.DEVICE_KEY_MISMATCH.value if "dev-01" in admitted else first["dev-01"]
        assert by_device[41] == mismatch
    finally:
        for e in engines:
            await e.dispose()


def test_uses_never_exceed_max_uses_across_two_enrollers() -> None:
    with postgresql_database() as url:
        migrate(url)
        asyncio.run(scenario(url))
