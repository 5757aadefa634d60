"""The audit log: every operator action, who did it, to what."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from control_plane.db.models import AuditEntry


def record(session: AsyncSession, actor: str, action: str, target: str, **details: Any) -> None:
    session.add(
        AuditEntry(
            time=datetime.now(UTC), actor=actor, action=action, target=target, details=details
        )
    )
