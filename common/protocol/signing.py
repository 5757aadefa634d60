"""Ed25519 signatures over canonical JSON, and the device's trust root.

A signed message is an envelope ``{"schema_version", "signed": {...}, "signatures": [{"key_id",
"sig"}]}``. Signatures cover the canonical bytes of ``signed`` *as received* (keys sorted, no
spaces, UTF-8), so a newer sender may add fields without breaking older verifiers.

The trust root (TUF's root role, simplified) lists root keys, which sign trust root updates,
and manifest keys, which sign manifests and commands. An update must carry a higher version and
be signed by ``root_threshold`` current root keys (and, when the root keys change, by that many
of the new ones too), so a single stolen manifest key cannot grant itself more trust.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from common.protocol import SCHEMA_VERSION
from common.protocol.errors import ProtocolError, Rejection


def canonical_bytes(obj: Any) -> bytes:
    """The bytes a signature covers: JSON with sorted keys, no whitespace, UTF-8."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_key_b64(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


class SigningKey:
    """An Ed25519 private key. Never logged, never serialised except to its PEM file."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_key = private_key.public_key()
        self.key_id = key_id(self.public_key)

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, data: bytes) -> SigningKey:
        key = serialization.load_pem_private_key(data, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("the key file does not hold an Ed25519 private key")
        return cls(key)

    def to_pem(self) -> bytes:
        return self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def public(self) -> PublicKey:
        return PublicKey(key_id=self.key_id, public_key=public_key_b64(self.public_key))

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self._key.sign(data)).decode()

    def __repr__(self) -> str:  # keep the secret out of logs and tracebacks
        return f"SigningKey(key_id={self.key_id!r})"


class PublicKey(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str
    public_key: str
    """Raw Ed25519 public key, base64."""

    @field_validator("public_key")
    @classmethod
    def _ed25519(cls, value: str) -> str:
        try:
            raw = base64.b64decode(value, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"not base64: {exc}") from None
        if len(raw) != 32:
            raise ValueError("an Ed25519 public key is 32 bytes")
        return value

    def loaded(self) -> Ed25519PublicKey:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(self.public_key))
        if key_id(key) != self.key_id:
            raise ProtocolError(
                Rejection.MALFORMED, f"key {self.key_id} does not match its public key"
            )
        return key


class Signature(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str
    sig: str


class Envelope(BaseModel):
    """A signed message as it travels."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    signed: dict[str, Any]
    signatures: list[Signature] = Field(min_length=1)


def sign_envelope(payload: dict[str, Any], *keys: SigningKey) -> Envelope:
    data = canonical_bytes(payload)
    return Envelope(
        signed=payload, signatures=[Signature(key_id=k.key_id, sig=k.sign(data)) for k in keys]
    )


def parse_envelope(raw: bytes | str | dict[str, Any]) -> Envelope:
    try:
        doc = json.loads(raw) if isinstance(raw, bytes | str) else raw
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(Rejection.MALFORMED, f"not JSON: {exc}") from None
    except RecursionError:  # deeply nested arrays or objects: json recurses per level
        raise ProtocolError(Rejection.MALFORMED, "not JSON: nested too deeply") from None
    if isinstance(doc, dict) and doc.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise ProtocolError(
            Rejection.UNSUPPORTED_SCHEMA,
            f"schema_version {doc.get('schema_version')!r}, this agent speaks {SCHEMA_VERSION}",
        )
    try:
        envelope = Envelope.model_validate(doc)
    except ValidationError as exc:
        raise ProtocolError(Rejection.MALFORMED, _first_error(exc)) from None
    try:
        canonical_bytes(envelope.signed)
    except (ValueError, UnicodeEncodeError) as exc:
        # NaN, Infinity (which json.loads accepts) or a lone surrogate: nothing can sign it
        raise ProtocolError(Rejection.MALFORMED, f"signed: has no canonical form ({exc})") from None
    return envelope


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc']) or 'message'}: {first['msg']}"


def verified_signers(envelope: Envelope, keys: dict[str, PublicKey]) -> set[str]:
    """Key ids among ``keys`` whose signature on the envelope is valid."""
    data = canonical_bytes(envelope.signed)
    good = set()
    for s in envelope.signatures:
        key = keys.get(s.key_id)
        if key is None:
            continue
        try:
            key.loaded().verify(base64.b64decode(s.sig, validate=True), data)
        except (InvalidSignature, binascii.Error, ValueError):
            continue
        good.add(s.key_id)
    return good


class TrustRoot(BaseModel):
    """What a device trusts: root keys (sign trust updates) and manifest keys (sign manifests
    and commands), minus revoked key ids."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    version: int = Field(ge=1)
    root_keys: list[PublicKey] = Field(min_length=1)
    root_threshold: int = Field(default=1, ge=1)
    manifest_keys: list[PublicKey] = Field(min_length=1)
    revoked: list[str] = Field(default_factory=list)
    issued_at: datetime

    def manifest_key_map(self) -> dict[str, PublicKey]:
        return {k.key_id: k for k in self.manifest_keys if k.key_id not in self.revoked}

    def root_key_map(self) -> dict[str, PublicKey]:
        return {k.key_id: k for k in self.root_keys if k.key_id not in self.revoked}


def verify_signed(envelope: Envelope, trust: TrustRoot) -> str:
    """Check a manifest or command envelope against the manifest keys; return the signer.

    Raises:
        ProtocolError: unknown, revoked or non-manifest key, or no valid signature.
    """
    keys = trust.manifest_key_map()
    ids = [s.key_id for s in envelope.signatures]
    if all(i in trust.revoked for i in ids):
        raise ProtocolError(Rejection.REVOKED_KEY, f"signed by revoked key {ids[0]}")
    if not any(i in keys for i in ids):
        raise ProtocolError(
            Rejection.UNKNOWN_KEY, f"signed by key {ids[0]}, which this device does not trust"
        )
    signers = verified_signers(envelope, keys)
    if not signers:
        raise ProtocolError(
            Rejection.BAD_SIGNATURE, f"the signature of key {ids[0]} does not verify"
        )
    return sorted(signers)[0]


def apply_trust_update(current: TrustRoot, envelope: Envelope) -> TrustRoot:
    """The new trust root if the update is valid.

    Raises:
        ProtocolError: malformed, not newer, or without enough root signatures.
    """
    try:
        new = TrustRoot.model_validate(envelope.signed)
    except ValidationError as exc:
        raise ProtocolError(Rejection.MALFORMED, _first_error(exc)) from None
    if new.version <= current.version:
        raise ProtocolError(
            Rejection.REPLAYED,
            f"trust root version {new.version} is not newer than {current.version}",
        )
    if len(verified_signers(envelope, current.root_key_map())) < current.root_threshold:
        raise ProtocolError(
            Rejection.INSUFFICIENT_SIGNATURES,
            f"needs {current.root_threshold} signature(s) by current root keys",
        )
    if {k.key_id for k in new.root_keys} != {k.key_id for k in current.root_keys}:
        # NOTE: as TUF requires of a new root, the new root keys must sign too, which proves
        # the rotation was done by someone holding them.
        if len(verified_signers(envelope, new.root_key_map())) < new.root_threshold:
            raise ProtocolError(
                Rejection.INSUFFICIENT_SIGNATURES,
                f"a new root key set needs {new.root_threshold} signature(s) by the new root keys",
            )
    return new


def utcnow() -> datetime:
    return datetime.now(UTC)
