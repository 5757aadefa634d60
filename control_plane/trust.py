"""The fleet's trust root: created on first start, published retained, rotated and revoked
through the protocol's signed trust root updates (docs/protocol.md, "Trust and key rotation")."""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agent.fleet.state import write_atomically
from agent.protocol.signing import SigningKey, TrustRoot
from control_plane.bus import FleetBus
from control_plane.db.models import TrustRootRecord
from control_plane.errors import Conflict, NotFound
from control_plane.keys import KeyRing

log = logging.getLogger("edgefleet.control_plane.keys")


class TrustManager:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        keys: KeyRing,
        bus: FleetBus,
        state_dir: Path,
    ) -> None:
        self.sessions = sessions
        self.keys = keys
        self.bus = bus
        self.export_path = state_dir / "trust-root.json"

    async def current(self) -> TrustRoot:
        async with self.sessions() as s:
            record = (
                await s.execute(
                    select(TrustRootRecord).order_by(TrustRootRecord.version.desc()).limit(1)
                )
            ).scalar_one_or_none()
        if record is None:
            raise NotFound("no trust root yet")
        return TrustRoot.model_validate(record.envelope["signed"])

    async def ensure(self) -> TrustRoot:
        """Create trust root 1 on first start; publish the current one (retained) in any case.
        Devices are provisioned with ``state_dir/trust-root.json``."""
        try:
            trust = await self.current()
        except NotFound:
            trust = self.keys.initial_trust_root()
            await self._store(trust)
            log.info(
                "trust root created",
                extra={"version": 1, "manifest_key": self.keys.manifest_key.key_id},
            )
        self.keys.trust = trust
        await self._publish(trust)
        return trust

    async def _store(self, trust: TrustRoot) -> None:
        envelope = self.keys.sign_root(trust).model_dump(mode="json")
        async with self.sessions.begin() as s:
            s.add(
                TrustRootRecord(
                    version=trust.version, envelope=envelope, created_at=datetime.now(UTC)
                )
            )

    async def _publish(self, trust: TrustRoot) -> None:
        async with self.sessions() as s:
            record = await s.get(TrustRootRecord, trust.version)
        assert record is not None
        import json

        payload = json.dumps(record.envelope).encode()
        write_atomically(self.export_path, payload)
        self.bus.publish_retained(self.bus.topics.trust, payload)

    async def rotate(self) -> str:
        """Step 1 of a rotation: a new manifest key, announced beside the current one, and used
        for signing from now on. Revoke the old key once the fleet has the new root."""
        current = await self.current()
        new_key = SigningKey.generate()
        path = self.keys.manifest_key_path
        old_id = self.keys.manifest_key.key_id
        os.replace(path, path.with_name(f"manifest-{old_id}.pem"))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(new_key.to_pem())
        trust = current.model_copy(
            update={
                "version": current.version + 1,
                "issued_at": datetime.now(UTC),
                "manifest_keys": [*current.manifest_keys, new_key.public()],
            }
        )
        await self._store(trust)
        self.keys.manifest_key, self.keys.trust = new_key, trust
        await self._publish(trust)
        log.info(
            "manifest key rotated",
            extra={"old": old_id, "new": new_key.key_id, "trust_version": trust.version},
        )
        return new_key.key_id

    async def revoke(self, key_id: str) -> TrustRoot:
        current = await self.current()
        if key_id == self.keys.manifest_key.key_id:
            raise Conflict("that is the key signing manifests now; rotate first")
        if key_id not in {k.key_id for k in current.manifest_keys}:
            raise NotFound(f"{key_id} is not a manifest key of trust root {current.version}")
        trust = current.model_copy(
            update={
                "version": current.version + 1,
                "issued_at": datetime.now(UTC),
                "manifest_keys": [k for k in current.manifest_keys if k.key_id != key_id],
                "revoked": sorted({*current.revoked, key_id}),
            }
        )
        await self._store(trust)
        self.keys.trust = trust
        await self._publish(trust)
        log.info("manifest key revoked", extra={"key_id": key_id, "trust_version": trust.version})
        return trust
