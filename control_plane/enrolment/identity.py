"""What keeps a device's broker account whole when replicas make it at once: one writer of the
accounts at a time, across processes (:class:`AccountsLock`), and a password that depends on
the enrolment, not on which replica answered (:class:`DevicePasswords`).

Without them, two replicas each loaded the password file, added their batch and wrote it
back, and the later write lost the earlier one's devices (issue 47); and a device asking twice
at once (a retry while the first answer was on its way) got two passwords, of which only the
last written worked.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import hmac
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

LOCK_FILE = "accounts.lock"
"""Next to the password file in ``state_dir/mqtt``: the file lock's."""
ADVISORY_KEY = 0x6566_6163_6374
"""The PostgreSQL advisory lock's key (``"efacct"``): one for every replica of the fleet."""
SECRET_FILE = "enrolment.secret"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if need be), blocking until then: the
    writers of one host's files (replicas on SQLite, ``edgefleet fleet add-device``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class AccountsLock:
    """One writer of the broker's accounts at a time: a PostgreSQL advisory lock when the
    replicas share PostgreSQL (on a connection of its own, so a replica that dies frees it
    with its session), and a file lock next to the password file, which ``edgefleet fleet
    add-device`` and ``revoke-device`` take too (:func:`file_lock`)."""

    def __init__(self, mqtt_dir: Path, engine: AsyncEngine | None = None) -> None:
        self.path = mqtt_dir / LOCK_FILE
        self.engine = engine if engine is not None and engine.dialect.name == "postgresql" else None
        self._local = asyncio.Lock()  # this process's batches queue here, not in the database

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        async with self._local, contextlib.AsyncExitStack() as stack:
            if self.engine is not None:
                await stack.enter_async_context(_advisory(self.engine))
            await stack.enter_async_context(_in_thread(self.path))
            yield


@contextlib.asynccontextmanager
async def _advisory(engine: AsyncEngine) -> AsyncIterator[None]:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": ADVISORY_KEY})
        try:
            yield
        finally:
            await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_KEY})
            await conn.commit()


@contextlib.asynccontextmanager
async def _in_thread(path: Path) -> AsyncIterator[None]:
    """:func:`file_lock`, waited for in a thread so the event loop goes on meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = path.open("a")
    taking = asyncio.ensure_future(asyncio.to_thread(fcntl.flock, fh, fcntl.LOCK_EX))
    try:
        await asyncio.shield(taking)
    except BaseException:
        # cancelled while the thread still waits: once it has the lock, give it back (closing
        # the file under a waiting thread could lock whatever file reuses the descriptor)
        taking.add_done_callback(lambda _: fh.close())
        raise
    try:
        yield
    finally:
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


class DevicePasswords:
    """A device's broker password, HMAC-SHA256 of its device id and device key under the
    fleet's enrolment secret (``state_dir/mqtt/enrolment.secret``, mode 0600, shared by the
    replicas as their signing keys are). The same device key always gets the same password,
    at any replica: a retry, or twenty requests at once, never leave a dead one. Only the
    holder of the device key (a secret the device made) and of that file can compute it."""

    def __init__(self, mqtt_dir: Path) -> None:
        self.path = mqtt_dir / SECRET_FILE
        self._secret: bytes | None = None

    def secret(self) -> bytes:
        if self._secret is None:
            self._secret = _load_or_create(self.path)
        return self._secret

    def for_device(self, device_id: str, device_key: str) -> str:
        message = b"edgefleet broker password\0" + device_id.encode() + b"\0" + device_key.encode()
        digest = hmac.new(self.secret(), message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _load_or_create(path: Path) -> bytes:
    """The secret in ``path``, made first if there is none; replicas creating it at once agree
    on one (the first link wins)."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(32))
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(scratch, path)  # atomic, and refused if another replica was first
        scratch.unlink()
    secret = path.read_bytes()
    if len(secret) < 32:
        raise ValueError(f"{path}: an enrolment secret of {len(secret)} bytes, not 32")
    return secret
