"""The control plane's keys: the manifest key signs manifests and commands, the root key signs
trust root updates. Private keys stay in their PEM files (mode 0600) and never appear in logs
or API responses."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from common.protocol.signing import Envelope, PublicKey, SigningKey, TrustRoot, sign_envelope


def load_key(path: Path) -> SigningKey | None:
    """The key in ``path``, or None when there is no such file (a root key kept offline)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return SigningKey.from_pem(data)


def create_key(path: Path) -> SigningKey:
    """A new key in a new file of mode 0600; an existing file is never overwritten."""
    path.parent.mkdir(parents=True, exist_ok=True)
    key = SigningKey.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.to_pem())
    return key


def load_or_create_key(path: Path) -> SigningKey:
    key = load_key(path)
    return key if key is not None else create_key(path)


@dataclass
class KeyRing:
    """The manifest key, and the root key when its file was there at start-up: ``None`` when it
    is kept offline. ``root_key_path`` is where a root key is created on the very first start
    and looked for again when a trust root update needs it."""

    manifest_key: SigningKey
    root_key: SigningKey | None
    manifest_key_path: Path
    trust: TrustRoot | None = None
    extra_manifest_keys: list[PublicKey] = field(default_factory=list)
    root_key_path: Path | None = None

    def sign(self, payload: dict[str, Any]) -> dict[str, Any]:
        return sign_envelope(payload, self.manifest_key).model_dump(mode="json")

    def sign_message(self, message: BaseModel) -> dict[str, Any]:
        """A wire message (a manifest, a command) signed as the devices parse it."""
        return self.sign(message.model_dump(mode="json"))

    def initial_trust_root(self) -> TrustRoot:
        if self.root_key is None:
            raise RuntimeError("the root key is needed to create a trust root")
        return TrustRoot(
            version=1,
            root_keys=[self.root_key.public()],
            manifest_keys=[self.manifest_key.public()],
            issued_at=datetime.now(UTC),
        )

    def sign_root(self, trust: TrustRoot, root_key: SigningKey | None = None) -> Envelope:
        """Sign ``trust`` with ``root_key``, by default the one loaded at start-up."""
        key = root_key or self.root_key
        if key is None:
            raise RuntimeError("the root key is needed to sign a trust root (root_key_file)")
        return sign_envelope(trust.model_dump(mode="json"), key)
