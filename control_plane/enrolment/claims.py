"""Claim credentials: ``efc_<id>_<secret>``, shown once when created; only the SHA-256 of the
secret is kept (as API tokens are, :mod:`control_plane.tokens`).

A claim admits new devices while it is active: not revoked, not expired, and used fewer than
``max_uses`` times (one use per device that presented it first). The devices it admitted keep
their place when it expires or is used up; revoking it also refuses those still pending."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from control_plane.db.models import NAME_LENGTH, Claim
from control_plane.db.session import required_utc
from control_plane.db.states import ClaimState, Refusal

PREFIX = "efc"
MAX_LIFETIME_S = 366 * 86400.0


class ClaimSpec(BaseModel):
    """What an operator asks for when creating a claim."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=NAME_LENGTH)
    labels: dict[str, str] = Field(default_factory=dict)
    """Operator labels every device it enrols gets: its group, which deployments select on."""
    profiles: list[str] = Field(default_factory=list)
    """Hardware profiles a device enrolled by it may say it has; empty: any."""
    max_uses: int = Field(default=1, ge=1, le=1_000_000)
    """How many devices it may enrol."""
    ttl_s: float = Field(default=7 * 86400.0, gt=0, le=MAX_LIFETIME_S)
    """How long it admits new devices."""
    require_approval: bool = False
    """Devices wait, listed as pending, until an operator approves them."""


class EnrolmentRefused(Exception):
    """A device's enrolment request refused, with a machine-readable ``reason``."""

    def __init__(self, reason: Refusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def claim_state(claim: Claim, now: datetime) -> ClaimState:
    if claim.revoked:
        return ClaimState.REVOKED
    if required_utc(claim.expires_at) <= now:
        return ClaimState.EXPIRED
    if claim.uses >= claim.max_uses:
        return ClaimState.USED_UP
    return ClaimState.ACTIVE


def claim_doc(claim: Claim, now: datetime) -> dict[str, object]:
    return {
        "id": claim.id,
        "name": claim.name,
        "state": claim_state(claim, now).value,
        "labels": claim.labels,
        "profiles": claim.profiles,
        "max_uses": claim.max_uses,
        "uses": claim.uses,
        "expires_at": required_utc(claim.expires_at).isoformat(),
        "require_approval": claim.require_approval,
        "created_by": claim.created_by,
        "created_at": required_utc(claim.created_at).isoformat(),
    }


async def create_claim(session: AsyncSession, spec: ClaimSpec, user: str) -> tuple[Claim, str]:
    """Add a claim; return it and its token (which is not kept)."""
    claim_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    claim = Claim(
        id=claim_id,
        name=spec.name,
        secret_hash=_hash(secret),
        labels=spec.labels,
        profiles=spec.profiles,
        max_uses=spec.max_uses,
        uses=0,
        expires_at=now + timedelta(seconds=spec.ttl_s),
        require_approval=spec.require_approval,
        revoked=False,
        created_by=user,
        created_at=now,
    )
    session.add(claim)
    await session.flush()
    return claim, f"{PREFIX}_{claim_id}_{secret}"


async def find_claim(session: AsyncSession, token: str) -> Claim:
    """The claim of ``token``, whatever its state.

    Raises:
        EnrolmentRefused: not a token of a claim here (unknown_claim).
    """
    parts = token.split("_", 2)
    claim = await session.get(Claim, parts[1]) if len(parts) == 3 and parts[0] == PREFIX else None
    if claim is None or not hmac.compare_digest(claim.secret_hash, _hash(parts[2])):
        raise EnrolmentRefused(Refusal.UNKNOWN_CLAIM, "the claim token is not known here")
    return claim


def refuse_inactive(claim: Claim, now: datetime) -> None:
    """Raise EnrolmentRefused (expired, revoked, used up) unless the claim admits devices."""
    state = claim_state(claim, now)
    if state is ClaimState.REVOKED:
        raise EnrolmentRefused(Refusal.CLAIM_REVOKED, f"claim {claim.name!r} was revoked")
    if state is ClaimState.EXPIRED:
        expired = required_utc(claim.expires_at).isoformat()
        raise EnrolmentRefused(Refusal.CLAIM_EXPIRED, f"claim {claim.name!r} expired at {expired}")
    if state is ClaimState.USED_UP:
        raise EnrolmentRefused(
            Refusal.CLAIM_USED_UP,
            f"claim {claim.name!r} has enrolled its {claim.max_uses} device(s) already",
        )


async def take_uses(session: AsyncSession, claim: Claim, wanted: int, now: datetime) -> int:
    """Count up to ``wanted`` uses, in the database's own check: devices presenting the last
    uses at once (in this process or another) cannot take more than ``max_uses``. Return how
    many were taken; the claim's row stays locked until the caller commits.

    Raises:
        EnrolmentRefused: none taken: revoked, expired or used up by the time it was counted.
    """
    if await _add_uses(session, claim, wanted, now):
        return wanted  # the usual case: one statement
    # fewer left than wanted: lock the row, read what is left, take that
    fresh = (
        await session.execute(
            select(Claim)
            .where(Claim.id == claim.id)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
    ).scalar_one()
    refuse_inactive(fresh, now)
    left = min(wanted, fresh.max_uses - fresh.uses)
    if not await _add_uses(session, fresh, left, now):
        raise EnrolmentRefused(Refusal.CLAIM_USED_UP, f"claim {claim.name!r} is used up")
    return left


async def _add_uses(session: AsyncSession, claim: Claim, n: int, now: datetime) -> bool:
    result = await session.execute(
        update(Claim)
        .where(
            Claim.id == claim.id,
            Claim.uses + n <= Claim.max_uses,
            Claim.revoked.is_(False),
            Claim.expires_at > now,
        )
        .values(uses=Claim.uses + n)
        .execution_options(synchronize_session=False)
    )
    return getattr(result, "rowcount", 0) == 1


async def claims_of(session: AsyncSession, tokens: list[str]) -> dict[str, Claim]:
    """The claims of those ``tokens`` that are a claim's (read in one statement)."""
    ids = {p[1]: p for p in (t.split("_", 2) for t in tokens) if len(p) == 3 and p[0] == PREFIX}
    if not ids:
        return {}
    rows = await session.execute(select(Claim).where(Claim.id.in_(ids)))
    by_id = {c.id: c for c in rows.scalars()}
    found: dict[str, Claim] = {}
    for token in tokens:
        parts = token.split("_", 2)
        claim = by_id.get(parts[1]) if len(parts) == 3 and parts[0] == PREFIX else None
        if claim is not None and hmac.compare_digest(claim.secret_hash, _hash(parts[2])):
            found[token] = claim
    return found


async def list_claims(session: AsyncSession) -> list[Claim]:
    return list((await session.execute(select(Claim).order_by(Claim.created_at))).scalars())


def key_hash(device_key: str) -> str:
    return _hash(device_key)


def same_key(stored_hash: str, device_key: str) -> bool:
    return hmac.compare_digest(stored_hash, _hash(device_key))
