"""The control plane's keys: the manifest key signs manifests and commands, the root key signs
trust root updates. Private keys stay in their PEM files (mode 0600) and never appear in logs
or API responses."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.protocol.signing import Envelope, PublicKey, SigningKey, TrustRoot, sign_envelope


def load_or_create_key(path: Path) -> SigningKey:
    if path.is_file():
        return SigningKey.from_pem(path.read_bytes())
    path.parent.mkdir(parents=True, exist_ok=True)
    key = SigningKey.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.to_pem())
    return key


@dataclass
class KeyRing:
    manifest_key: SigningKey
    root_key: SigningKey | None
    manifest_key_path: Path
    trust: TrustRoot | None = None
    extra_manifest_keys: list[PublicKey] = field(default_factory=list)

    def sign(self, payload: dict[str, Any]) -> dict[str, Any]:
        return sign_envelope(payload, self.manifest_key).model_dump(mode="json")

    def initial_trust_root(self) -> TrustRoot:
        if self.root_key is None:
            raise RuntimeError("the root key is needed to create a trust root")
        return TrustRoot(
            version=1,
            root_keys=[self.root_key.public()],
            manifest_keys=[self.manifest_key.public()],
            issued_at=datetime.now(UTC),
        )

    def sign_root(self, trust: TrustRoot) -> Envelope:
        if self.root_key is None:
            raise RuntimeError("the root key is needed to sign a trust root (root_key_file)")
        return sign_envelope(trust.model_dump(mode="json"), self.root_key)
