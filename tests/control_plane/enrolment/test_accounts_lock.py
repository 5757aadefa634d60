"""One writer of the broker's accounts across replicas (issue 47): two replicas' worth of
password-file accounts (each its own in-process lock, and on PostgreSQL its own engine) writing
the same state directory at once lose no device; the lock one holds keeps the other out; a
device's password is the same whoever derives it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.protocol.topics import Topics
from control_plane.db.session import make_engine
from control_plane.enrolment.accounts import PasswordFileAccounts
from control_plane.enrolment.identity import AccountsLock, DevicePasswords
from control_plane.provisioning.passwords import PasswordFile, verify_password
from tests.control_plane.enrolment.conftest import postgresql_database

DEVICES = 30


@contextlib.contextmanager
def database(kind: str, tmp_path: Path) -> Iterator[str | None]:
    if kind == "sqlite":
        yield None  # no shared database: the file lock alone
        return
    with postgresql_database() as url:
        yield url


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_two_writers_at_once_lose_no_account(tmp_path: Path, kind: str) -> None:
    state = tmp_path / "cp-state"
    with database(kind, tmp_path) as url:

        async def scenario() -> dict[str, str]:
            engines = [make_engine(url), make_engine(url)] if url else [None, None]
            try:
                replicas = [
                    PasswordFileAccounts(
                        state,
                        Topics("edgefleet"),
                        reload_interval_s=0.0,
                        lock=AccountsLock(state / "mqtt", engine),
                    )
                    for engine in engines
                ]

                async def one_by_one(n: int, accounts: PasswordFileAccounts) -> dict[str, str]:
                    # a batch a device: as many load-add-rewrite cycles as devices
                    return {
                        f"dev-{n}-{i}": await accounts.issue(f"dev-{n}-{i}") for i in range(DEVICES)
                    }

                issued = await asyncio.gather(*(one_by_one(n, a) for n, a in enumerate(replicas)))
                return issued[0] | issued[1]
            finally:
                for engine in engines:
                    if engine is not None:
                        await engine.dispose()

        passwords = asyncio.run(scenario())
    stored = PasswordFile.load(state / "mqtt" / "passwd").entries
    assert len(passwords) == 2 * DEVICES
    missing = sorted(set(passwords) - set(stored))
    assert not missing, f"{len(missing)} accounts lost: {missing[:5]}"
    assert all(verify_password(stored[d], p) for d, p in passwords.items())


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_the_lock_one_holds_keeps_the_other_out(tmp_path: Path, kind: str) -> None:
    with database(kind, tmp_path) as url:

        async def scenario() -> tuple[bool, bool]:
            engines = [make_engine(url), make_engine(url)] if url else [None, None]
            a, b = (AccountsLock(tmp_path / "mqtt", e) for e in engines)
            try:
                async with a.held():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.5), b.held():
                            return True, False  # b got in while a held it
                    blocked = True
                async with asyncio.timeout(10), b.held():
                    return False, blocked
            finally:
                for engine in engines:
                    if engine is not None:
                        await engine.dispose()

        entered_while_held, blocked = asyncio.run(scenario())
    assert not entered_while_held and blocked


def test_a_device_key_gets_one_password_at_any_replica(tmp_path: Path) -> None:
    mqtt = tmp_path / "mqtt"
    a, b = DevicePasswords(mqtt), DevicePasswords(mqtt)  # two replicas, one state directory
    key = "k" * 40
    assert a.for_device("dev-1", key) == b.for_device("dev-1", key)
    assert a.for_device("dev-1", key) != a.for_device("dev-2", key)
    assert a.for_device("dev-1", key) != a.for_device("dev-1", "j" * 40)
    assert len(a.for_device("dev-1", key)) >= 43  # 256 bits
    assert (mqtt / "enrolment.secret").stat().st_mode & 0o777 == 0o600
    other_fleet = DevicePasswords(tmp_path / "elsewhere")
    assert other_fleet.for_device("dev-1", key) != a.for_device("dev-1", key)
