"""The trust root and its key files across restarts: a root key kept offline, a root key the
trust root does not list, a rotation the database refused, two rotations at once, and manifest
key files that disagree with the trust root. Each start is the control plane's composition root
(``control_plane.main.build``, then the trust root's start-up) on the same SQLite database and
state directory; what a device makes of the result is checked with the agent's own rules."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from common.protocol.signing import (
    SigningKey,
    TrustRoot,
    apply_trust_update,
    parse_envelope,
    verify_signed,
)
from control_plane.api.deps import Services
from control_plane.errors import Conflict
from control_plane.main import build
from control_plane.settings import ControlPlaneSettings
from control_plane.signing.trust import TrustManager


@dataclass
class Device:
    """What a device provisioned with the control plane's ``trust-root.json`` trusts."""

    trust: TrustRoot

    @classmethod
    def provisioned(cls, cp: ControlPlaneSettings) -> Device:
        return cls(TrustRoot.model_validate(json.loads(trust_file(cp).read_bytes())["signed"]))

    def receive_trust_root(self, cp: ControlPlaneSettings) -> None:
        """Apply the published trust root, as the agent does (raises if it refuses it)."""
        self.trust = apply_trust_update(self.trust, parse_envelope(trust_file(cp).read_bytes()))

    def check_manifest(self, services: Services) -> str:
        """The key of a manifest signed now, if this device accepts it (raises if not)."""
        signed = services.keys.sign({"schema_version": 1, "model": "mlp", "sequence": 1})
        return verify_signed(parse_envelope(signed), self.trust)


def trust_file(cp: ControlPlaneSettings) -> Path:
    return cp.state_dir / "trust-root.json"


def root_file(cp: ControlPlaneSettings) -> Path:
    return cp.state_dir / "keys" / "root.pem"


def manifest_file(cp: ControlPlaneSettings) -> Path:
    return cp.state_dir / "keys" / "manifest.pem"


def key_in(path: Path) -> str:
    return SigningKey.from_pem(path.read_bytes()).key_id


def settings(tmp_path: Path) -> ControlPlaneSettings:
    return ControlPlaneSettings(
        db_url=f"sqlite+aiosqlite:///{tmp_path}/cp.db",
        mqtt_url="mqtt://127.0.0.1:1",  # never connected: the bus only queues the trust root
        state_dir=tmp_path / "cp-state",
        artifact_dir=tmp_path / "cp-state" / "artifacts",
    )


@contextlib.asynccontextmanager
async def started(cp: ControlPlaneSettings) -> AsyncIterator[tuple[Services, TrustManager]]:
    """A (re)start of the control plane up to its trust root; stopped on exit."""
    services, trust = build(cp)
    try:
        await trust.ensure()
        yield services, trust
    finally:
        async with services.sessions() as s:
            engine = s.bind
        assert isinstance(engine, AsyncEngine)
        await engine.dispose()


def test_a_root_key_kept_offline_is_not_replaced_and_changes_wait_for_it(tmp_path: Path) -> None:
    cp, usb = settings(tmp_path), tmp_path / "usb" / "root.pem"

    async def scenario() -> None:
        async with started(cp) as (services, trust):
            k0 = services.keys.manifest_key.key_id
            device = Device.provisioned(cp)
            k1 = await trust.rotate()
        device.receive_trust_root(cp)
        assert [k.key_id for k in device.trust.root_keys] == [key_in(root_file(cp))]
        usb.parent.mkdir()
        shutil.move(root_file(cp), usb)  # as docs/security.md advises

        async with started(cp) as (services, trust):
            assert not root_file(cp).exists()  # not replaced by a key no device trusts
            assert device.check_manifest(services) == k1
            for change in (trust.rotate(), trust.revoke(k0)):
                with pytest.raises(Conflict, match="root key is offline") as refused:
                    await change
                assert str(root_file(cp)) in refused.value.message
            assert (await trust.current()).version == 2
            assert key_in(manifest_file(cp)) == k1

            shutil.copy(usb, root_file(cp))  # put back for the changes, no restart needed
            k2 = await trust.rotate()
            device.receive_trust_root(cp)
            assert device.check_manifest(services) == k2
            await trust.revoke(k0)
            device.receive_trust_root(cp)
            assert device.trust.version == 4 and device.trust.revoked == [k0]

    asyncio.run(scenario())


def test_a_root_key_the_trust_root_does_not_list_is_refused(tmp_path: Path) -> None:
    cp = settings(tmp_path)

    async def scenario() -> None:
        async with started(cp) as (services, _):
            k0 = services.keys.manifest_key.key_id
        fleet_root = root_file(cp).read_bytes()
        stranger = SigningKey.generate()
        root_file(cp).write_bytes(stranger.to_pem())

        with pytest.raises(Conflict, match="not a root key of trust root 1") as refused:
            async with started(cp):
                pass
        assert str(root_file(cp)) in refused.value.message

        root_file(cp).unlink()  # offline at start-up, then the wrong key put back to rotate
        async with started(cp) as (services, trust):
            root_file(cp).write_bytes(stranger.to_pem())
            with pytest.raises(Conflict, match=stranger.key_id):
                await trust.rotate()
            assert (await trust.current()).version == 1
            assert services.keys.manifest_key.key_id == key_in(manifest_file(cp)) == k0
            root_file(cp).write_bytes(fleet_root)
            await trust.rotate()
            assert (await trust.current()).version == 2

    asyncio.run(scenario())


def test_a_rotation_the_database_refuses_changes_no_key(tmp_path: Path) -> None:
    cp = settings(tmp_path)
    db = sqlite3.connect(tmp_path / "cp.db", isolation_level=None)

    async def scenario() -> None:
        async with started(cp) as (services, trust):
            k0 = services.keys.manifest_key.key_id
            device = Device.provisioned(cp)
            # another writer makes the database refuse the new trust root (a real failure
            # of the write, as an outage or a full disk would be)
            db.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON trust_roots"
                " BEGIN SELECT RAISE(ABORT, 'the database refuses writes'); END"
            )
            with pytest.raises(DBAPIError, match="refuses writes"):
                await trust.rotate()
            db.execute("DROP TRIGGER refuse")
            assert (await trust.current()).version == 1
            assert key_in(manifest_file(cp)) == k0
            assert device.check_manifest(services) == k0

        async with started(cp) as (services, trust):
            assert device.check_manifest(services) == k0  # after a restart too
            k1 = await trust.rotate()
            device.receive_trust_root(cp)
            assert device.check_manifest(services) == k1
            assert key_in(manifest_file(cp)) == k1
            assert key_in(manifest_file(cp).with_name(f"manifest-{k0}.pem")) == k0

    try:
        asyncio.run(scenario())
    finally:
        db.close()


def test_two_rotations_at_once_follow_each_other(tmp_path: Path) -> None:
    cp = settings(tmp_path)
    db = sqlite3.connect(tmp_path / "cp.db", isolation_level=None)

    async def scenario() -> None:
        async with started(cp) as (services, trust):
            k0 = services.keys.manifest_key.key_id
            device = Device.provisioned(cp)
            # a slow database: another writer holds it until both rotations are under way (a
            # CLI retry after a timeout, two admins): the first has written its next key and
            # waits to store trust root 2
            db.execute("BEGIN EXCLUSIVE")
            both = asyncio.gather(trust.rotate(), trust.rotate())
            pending = manifest_file(cp).with_name(manifest_file(cp).name + ".next")
            for _ in range(500):  # 5 s at most: without the lock both may fail first
                if pending.exists() or both.done():
                    break
                await asyncio.sleep(0.01)
            db.execute("ROLLBACK")
            k1, k2 = await both
            current = await trust.current()
            assert current.version == 3
            assert [k.key_id for k in current.manifest_keys] == [k0, k1, k2]
            device.receive_trust_root(cp)
            assert device.check_manifest(services) == k2
        for key_id in (k0, k1):
            assert key_in(manifest_file(cp).with_name(f"manifest-{key_id}.pem")) == key_id
        async with started(cp) as (services, _):
            assert device.check_manifest(services) == k2

    try:
        asyncio.run(scenario())
    finally:
        db.close()


def test_start_up_signs_with_a_trusted_manifest_key_or_refuses(tmp_path: Path) -> None:
    cp = settings(tmp_path)
    archive = manifest_file(cp).with_name

    async def scenario() -> None:
        async with started(cp) as (services, _):
            k0 = services.keys.manifest_key.key_id
        device = Device.provisioned(cp)
        # what a rotation of an earlier release left when the database refused its trust
        # root: the old key archived, and a key that no trust root lists in its place
        shutil.move(manifest_file(cp), archive(f"manifest-{k0}.pem"))
        untrusted = SigningKey.generate()
        manifest_file(cp).write_bytes(untrusted.to_pem())

        async with started(cp) as (services, _):
            assert device.check_manifest(services) == k0
        assert key_in(manifest_file(cp)) == k0
        assert key_in(archive(f"manifest-{untrusted.key_id}.pem")) == untrusted.key_id

        archive(f"manifest-{k0}.pem").unlink()  # no trusted key left anywhere
        manifest_file(cp).write_bytes(untrusted.to_pem())
        with pytest.raises(Conflict, match="not a trusted manifest key") as refused:
            async with started(cp):
                pass
        assert str(manifest_file(cp)) in refused.value.message

    asyncio.run(scenario())


def test_a_rotation_interrupted_after_its_trust_root_is_finished_at_start_up(
    tmp_path: Path,
) -> None:
    cp = settings(tmp_path)
    pending = manifest_file(cp).with_name("manifest.pem.next")

    async def scenario() -> None:
        async with started(cp) as (services, trust):
            k0 = services.keys.manifest_key.key_id
            device = Device.provisioned(cp)
            k1 = await trust.rotate()
        device.receive_trust_root(cp)
        # the files as they were when trust root 2 was stored, before the new key moved in
        shutil.move(manifest_file(cp), pending)
        shutil.copy(manifest_file(cp).with_name(f"manifest-{k0}.pem"), manifest_file(cp))

        async with started(cp) as (services, _):
            assert device.check_manifest(services) == k1
        assert key_in(manifest_file(cp)) == k1 and not pending.exists()

        # the new key of a rotation whose trust root was never stored is dropped
        pending.write_bytes(SigningKey.generate().to_pem())
        async with started(cp) as (services, _):
            assert device.check_manifest(services) == k1
        assert key_in(manifest_file(cp)) == k1 and not pending.exists()

    asyncio.run(scenario())
