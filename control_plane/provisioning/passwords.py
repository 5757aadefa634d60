"""Mosquitto's password file: ``user:$7$<iterations>$<salt b64>$<hash b64>`` per line, the hash
being PBKDF2-HMAC-SHA512 of the password (64 bytes) over a 12-byte salt.

NOTE: the format is mosquitto_passwd's (mosquitto 2.0, ``pw__hash`` in src/password_mosq.c);
tests check a generated file against the real broker and the real ``mosquitto_passwd``.
The control plane keeps hashes only: a device's password is shown once, when it is issued.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from common.files import write_atomically

ITERATIONS = 101
"""mosquitto_passwd's default. The passwords issued here are 256-bit random tokens, so the
iteration count does not protect them; it only costs the broker CPU at every connect."""
SALT_BYTES = 12


def new_password() -> str:
    return secrets.token_urlsafe(32)


def hash_password(password: str, *, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else os.urandom(SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(encoded: str, password: str) -> bool:
    try:
        _, kind, iterations, salt, digest = encoded.split("$")
        if kind != "7":
            return False
        expected = base64.b64decode(digest, validate=True)
        actual = hashlib.pbkdf2_hmac(
            "sha512", password.encode(), base64.b64decode(salt, validate=True), int(iterations)
        )
    except ValueError:
        return False
    return hmac.compare_digest(expected, actual)


@dataclass
class PasswordFile:
    """The password file of a fleet's broker, one entry per device and service user."""

    path: Path
    entries: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> PasswordFile:
        entries: dict[str, str] = {}
        if path.is_file():
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                user, sep, encoded = line.partition(":")
                if not sep or not encoded.startswith("$"):
                    raise ValueError(f"{path}:{number}: not a user:hash line")
                entries[user] = encoded
        return cls(path, entries)

    def issue(self, user: str, password: str | None = None) -> str:
        """Give ``user`` ``password`` (None: a new random one), replacing any old one, and
        return it."""
        if ":" in user or not user:
            raise ValueError(f"username {user!r}: must be non-empty and without ':'")
        password = password or new_password()
        self.entries[user] = hash_password(password)
        return password

    def only(self, users: tuple[str, ...], path: Path) -> PasswordFile:
        """A copy, to be saved at ``path``, holding ``users``' entries alone."""
        return PasswordFile(path, {u: self.entries[u] for u in users if u in self.entries})

    def remove(self, user: str) -> bool:
        return self.entries.pop(user, None) is not None

    def render(self) -> str:
        return "".join(f"{user}:{encoded}\n" for user, encoded in sorted(self.entries.items()))

    def save(self, path: Path | None = None) -> None:
        target = path or self.path
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, self.render().encode())
        target.chmod(0o600)
