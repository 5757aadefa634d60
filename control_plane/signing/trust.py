"""The fleet's trust root: created on first start, published retained, rotated and revoked
through the protocol's signed trust root updates (docs/protocol.md, "Trust and key rotation").

Key files (docs/security.md, "Keys on disk"): the manifest key in ``manifest_key_path``; each
manifest key it replaced in ``manifest-<key id>.pem`` beside it; during a rotation, the new key
in ``<manifest key file>.next`` until trust root N+1 is stored, and only then moved into place.
Every device refuses what a key outside its trust root signs, so the control plane never signs
with one: start-up checks the key files against the current trust root."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from common.files import fsync_path, write_atomically
from common.protocol.signing import SigningKey, TrustRoot
from control_plane.db.models import TrustRootRecord
from control_plane.errors import Conflict, NotFound
from control_plane.mqtt.publisher import Publisher
from control_plane.signing.keys import KeyRing, load_key, load_or_create_key

log = logging.getLogger("edgefleet.control_plane.keys")


class TrustManager:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        keys: KeyRing,
        bus: Publisher,
        state_dir: Path,
    ) -> None:
        self.sessions = sessions
        self.keys = keys
        self.bus = bus
        self.export_path = state_dir / "trust-root.json"
        self._changing = asyncio.Lock()
        """One change at a time: two rotations at once would both build on trust root N and
        move key files under each other."""

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
        """Create trust root 1 (and the root key, if its file is not there) on first start;
        publish the current one (retained) in any case. Devices are provisioned with
        ``state_dir/trust-root.json``.

        Raises:
            Conflict: the root key file holds a key that is not a root key of the current
                trust root, or neither the manifest key file nor an archived one beside it
                holds a trusted manifest key: devices would refuse what either signs.
        """
        async with self._changing:
            try:
                trust = await self.current()
            except NotFound:
                trust = await self._create()
            else:
                if self.keys.root_key is not None:
                    self._check_root_key(trust, self.keys.root_key)
                self._settle_manifest_key(trust)
            self.keys.trust = trust
            await self._publish(trust)
            return trust

    async def rotate(self) -> str:
        """Step 1 of a rotation: a new manifest key, announced beside the current one, and used
        for signing from now on. Revoke the old key once the fleet has the new root.

        Raises:
            Conflict: the root key is offline, or is not a root key of the current trust root.
        """
        async with self._changing:
            current = await self.current()
            root_key = self._root_key_for_change(current)
            new_key = SigningKey.generate()
            pending = self._pending_path()
            write_atomically(pending, new_key.to_pem())
            trust = current.model_copy(
                update={
                    "version": current.version + 1,
                    "issued_at": datetime.now(UTC),
                    "manifest_keys": [*current.manifest_keys, new_key.public()],
                }
            )
            try:
                await self._store(trust, root_key)
            except Exception:
                # not stored: no device will trust the new key, so nothing may be signed with it
                pending.unlink(missing_ok=True)
                raise
            old_id = self.keys.manifest_key.key_id
            self._install(new_key)
            self.keys.trust = trust
            await self._publish(trust)
        log.info(
            "manifest key rotated",
            extra={"old": old_id, "new": new_key.key_id, "trust_version": trust.version},
        )
        return new_key.key_id

    async def revoke(self, key_id: str) -> TrustRoot:
        """Trust root N+1 without manifest key ``key_id``, and listing it as revoked.

        Raises:
            Conflict: ``key_id`` signs manifests now, or the root key is offline or unknown.
            NotFound: ``key_id`` is not a manifest key of the current trust root.
        """
        async with self._changing:
            current = await self.current()
            if key_id == self.keys.manifest_key.key_id:
                raise Conflict("that is the key signing manifests now; rotate first")
            if key_id not in {k.key_id for k in current.manifest_keys}:
                raise NotFound(f"{key_id} is not a manifest key of trust root {current.version}")
            root_key = self._root_key_for_change(current)
            trust = current.model_copy(
                update={
                    "version": current.version + 1,
                    "issued_at": datetime.now(UTC),
                    "manifest_keys": [k for k in current.manifest_keys if k.key_id != key_id],
                    "revoked": sorted({*current.revoked, key_id}),
                }
            )
            await self._store(trust, root_key)
            self.keys.trust = trust
            await self._publish(trust)
        log.info("manifest key revoked", extra={"key_id": key_id, "trust_version": trust.version})
        return trust

    # -- the root key ------------------------------------------------------------------------

    async def _create(self) -> TrustRoot:
        if self.keys.root_key is None and self.keys.root_key_path is not None:
            # the very first start: there is no trust root a key of ours could disagree with
            self.keys.root_key = load_or_create_key(self.keys.root_key_path)
        trust = self.keys.initial_trust_root()
        await self._store(trust, self.keys.root_key)
        log.info(
            "trust root created",
            extra={"version": 1, "manifest_key": self.keys.manifest_key.key_id},
        )
        return trust

    def _root_key_for_change(self, current: TrustRoot) -> SigningKey:
        """The root key loaded at start-up, or else its file read now: an operator who keeps
        it offline puts it back for the change (and may take it away again afterwards)."""
        path = self.keys.root_key_path
        key = self.keys.root_key
        if key is None and path is not None:
            key = load_key(path)
        if key is None:
            raise Conflict(
                f"the root key is offline: put its file back at {path or '(root_key_file)'}"
                " to change the trust root (root_key_file); it can go offline again afterwards"
            )
        self._check_root_key(current, key)
        return key

    def _check_root_key(self, current: TrustRoot, key: SigningKey) -> None:
        if key.key_id not in current.root_key_map():
            raise Conflict(
                f"the root key file {self.keys.root_key_path or '(root_key_file)'} holds key"
                f" {key.key_id}, which is not a root key of trust root {current.version}"
                f" ({', '.join(current.root_key_map())}): devices would refuse what it signs."
                " Put the fleet's root key file there, or no file to keep the root key offline"
            )

    # -- the manifest key files ----------------------------------------------------------------

    def _pending_path(self) -> Path:
        path = self.keys.manifest_key_path
        return path.with_name(f"{path.name}.next")

    def _archive_path(self, key_id: str) -> Path:
        return self.keys.manifest_key_path.with_name(f"manifest-{key_id}.pem")

    def _install(self, new_key: SigningKey) -> None:
        """Archive the current manifest key, move the pending one into place, sign with it."""
        old = self.keys.manifest_key
        # written from the key in memory: the archive holds what its name says, whatever
        # happened to the files before
        write_atomically(self._archive_path(old.key_id), old.to_pem())
        os.replace(self._pending_path(), self.keys.manifest_key_path)
        fsync_path(self.keys.manifest_key_path.parent)
        self.keys.manifest_key = new_key

    def _settle_manifest_key(self, current: TrustRoot) -> None:
        """Sign with a manifest key of ``current``: finish a rotation that stored its trust
        root but stopped before moving its key file, or fall back to the newest archived key
        the trust root still lists."""
        trusted = current.manifest_key_map()
        pending = load_key(self._pending_path())
        if pending is not None:
            if pending.key_id in trusted and pending.key_id != self.keys.manifest_key.key_id:
                self._install(pending)
                log.warning("finished an interrupted key rotation", extra={"new": pending.key_id})
            else:  # its trust root was never stored
                self._pending_path().unlink()
        key = self.keys.manifest_key
        if key.key_id in trusted:
            return
        for public in reversed(current.manifest_keys):  # the newest first
            if public.key_id not in trusted:
                continue
            archived = load_key(self._archive_path(public.key_id))
            if archived is not None and archived.key_id == public.key_id:
                write_atomically(self._archive_path(key.key_id), key.to_pem())
                write_atomically(self.keys.manifest_key_path, archived.to_pem())
                self.keys.manifest_key = archived
                log.warning(
                    "the manifest key file held a key the trust root does not list; signing"
                    " with the newest archived key it lists",
                    extra={"untrusted": key.key_id, "key_id": archived.key_id},
                )
                return
        raise Conflict(
            f"the manifest key file {self.keys.manifest_key_path} holds key {key.key_id}, which"
            f" is not a trusted manifest key of trust root {current.version}"
            f" ({', '.join(trusted)}), and no manifest-<key id>.pem beside it holds one:"
            " devices would refuse everything it signs. Put a trusted manifest key file there"
        )

    # -- storing and publishing ----------------------------------------------------------------

    async def _store(self, trust: TrustRoot, root_key: SigningKey | None) -> None:
        envelope = self.keys.sign_root(trust, root_key).model_dump(mode="json")
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
        payload = json.dumps(record.envelope).encode()
        write_atomically(self.export_path, payload)
        self.bus.publish_retained(self.bus.topics.trust, payload)
