"""API tokens with roles, stored hashed. A token is ``efp_<id>_<secret>``; only the SHA-256 of
the secret is kept, and the token is shown once when created.

Below the routes: the API and the console authenticate with it, and ``edgefleet fleet`` and
``edgefleet control-plane token`` create tokens with it, importing no route."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from common.files import write_atomically
from control_plane.db.models import ApiToken


class Role(IntEnum):
    """Ordered: each role can do what the ones below it can."""

    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3


@dataclass(frozen=True)
class Principal:
    token_id: str
    name: str
    role: Role


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def create_token(session: AsyncSession, name: str, role: Role) -> str:
    token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    session.add(
        ApiToken(
            id=token_id,
            name=name,
            role=role.name.lower(),
            secret_hash=_hash(secret),
            created_at=datetime.now(UTC),
        )
    )
    await session.flush()
    return f"efp_{token_id}_{secret}"


async def authenticate(session: AsyncSession, token: str) -> Principal | None:
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != "efp":
        return None
    record = await session.get(ApiToken, parts[1])
    if record is None or record.revoked:
        return None
    if not hmac.compare_digest(record.secret_hash, _hash(parts[2])):  # constant time
        return None
    return Principal(record.id, record.name, Role[record.role.upper()])


async def has_tokens(session: AsyncSession) -> bool:
    return (await session.execute(select(ApiToken.id).limit(1))).first() is not None


async def bootstrap_admin(sessions: async_sessionmaker[AsyncSession], path: Path) -> bool:
    """On an empty database, create an admin token and write it to ``path`` (mode 0600): the
    token never goes to the log."""
    async with sessions.begin() as s:
        if await has_tokens(s):
            return False
        token = await create_token(s, "bootstrap-admin", Role.ADMIN)
    # A new file (mode 0600) renamed over the path: an existing file keeps its mode when
    # truncated, and whoever opened it while it was readable would read the new token.
    write_atomically(path, (token + "\n").encode())
    return True
