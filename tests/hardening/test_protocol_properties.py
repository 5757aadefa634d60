"""Property tests of the wire protocol's parsing and verification (common/protocol).

Whatever arrives (random bytes, random JSON, a signed manifest with any one change, a byte of
its serialisation flipped), the verifier either accepts exactly what was signed or raises
:class:`ProtocolError` with a rejection code; no other exception escapes, and no change to the
signed content survives its signature.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from common.protocol.errors import ProtocolError, Rejection
from common.protocol.signing import (
    SigningKey,
    TrustRoot,
    apply_trust_update,
    canonical_bytes,
    parse_envelope,
    sign_envelope,
)
from common.protocol.verify import DeviceIdentity, verify_command, verify_manifest

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DEVICE = DeviceIdentity("dev-1", "generic-x86_64", {"site": "lab"}, frozenset({"onnx"}))
ROOT_KEY, MANIFEST_KEY = SigningKey.generate(), SigningKey.generate()
TRUST = TrustRoot(
    version=1, root_keys=[ROOT_KEY.public()], manifest_keys=[MANIFEST_KEY.public()], issued_at=NOW
)
MANIFEST: dict[str, Any] = {
    "schema_version": 1,
    "model": "mlp",
    "version": 2,
    "sequence": 7,
    "artifacts": [
        {
            "format": "onnx",
            "files": [
                {
                    "name": "model.onnx",
                    "url": "http://127.0.0.1:1/x",
                    "sha256": "a" * 64,
                    "size": 10,
                }
            ],
        }
    ],
    "issued_at": NOW.isoformat(),
    "expires_at": (NOW + timedelta(hours=1)).isoformat(),
}
SIGNED = sign_envelope(MANIFEST, MANIFEST_KEY).model_dump(mode="json")
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=16,
)
FINITE_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=16,
)
"""What a signer can sign (non-finite numbers have their own test)."""
FAST = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def verify(raw: bytes | dict[str, Any]) -> Any:
    return verify_manifest(raw, TRUST, DEVICE, lambda model: None, NOW)


def refused(raw: bytes | dict[str, Any]) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        verify(raw)
    assert isinstance(info.value.code, Rejection)
    return info.value


def test_the_unmutated_manifest_verifies() -> None:
    """The baseline the properties below mutate: without a change, it is accepted."""
    assert verify(json.dumps(SIGNED).encode()).manifest.sequence == 7


@FAST
@given(st.binary(max_size=300))
def test_any_bytes_are_refused(raw: bytes) -> None:
    refused(raw)


@FAST
@given(JSON)
def test_any_json_is_refused(doc: Any) -> None:
    refused(json.dumps(doc).encode())


@FAST
@given(
    st.dictionaries(
        st.sampled_from(["schema_version", "signed", "signatures", "extra"]), JSON, max_size=4
    ),
    st.booleans(),
)
def test_any_envelope_shaped_document_is_refused(doc: dict[str, Any], as_dict: bool) -> None:
    refused(doc if as_dict else json.dumps(doc).encode())


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document a value sits."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, (*prefix, i))
    return out


@st.composite
def mutated_signed(draw: st.DrawFn) -> dict[str, Any]:
    """The signed manifest with one value replaced, deleted, or a key added, in ``signed``."""
    envelope = json.loads(json.dumps(SIGNED))
    signed = envelope["signed"]
    path = draw(st.sampled_from(paths(signed)))
    parent = signed
    for step in path[:-1]:
        parent = parent[step]
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    value = draw(FINITE_JSON)
    if action == "replace":
        parent[path[-1]] = value
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(max_size=8))] = value
    else:
        parent.insert(path[-1], value)
    return dict(envelope)


@FAST
@given(mutated_signed())
def test_a_valid_signature_over_changed_content_fails(envelope: dict[str, Any]) -> None:
    assume(canonical_bytes(envelope["signed"]) != canonical_bytes(MANIFEST))
    error = refused(json.dumps(envelope).encode())
    assert error.code == Rejection.BAD_SIGNATURE, error


@FAST
@given(st.data())
def test_a_flipped_byte_never_slips_through(data: st.DataObject) -> None:
    raw = bytearray(json.dumps(SIGNED).encode())
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] = data.draw(st.integers(0, 255).filter(lambda b: b != raw[i]))
    try:
        accepted = verify(bytes(raw))
    except ProtocolError:
        return
    # accepted: then the byte sat outside what is signed (the signature list's whitespace, a
    # key name's case...) and what was signed is exactly what verified
    assert canonical_bytes(accepted.envelope.signed) == canonical_bytes(MANIFEST)


@FAST
@given(st.binary(min_size=0, max_size=80) | st.text(max_size=100))
def test_a_forged_signature_is_refused(sig: bytes | str) -> None:
    envelope = json.loads(json.dumps(SIGNED))
    envelope["signatures"][0]["sig"] = (
        base64.b64encode(sig).decode() if isinstance(sig, bytes) else sig
    )
    assert refused(envelope).code == Rejection.BAD_SIGNATURE


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_json_numbers_in_signed_content_are_malformed(constant: str) -> None:
    raw = json.dumps(SIGNED).replace('"version": 2', f'"version": {constant}').encode()
    assert refused(raw).code == Rejection.MALFORMED


def test_a_lone_surrogate_in_signed_content_is_malformed() -> None:
    raw = json.dumps(SIGNED).replace('"model": "mlp"', '"model": "\\ud800"').encode()
    assert refused(raw).code == Rejection.MALFORMED


@FAST
@given(
    JSON
    | st.dictionaries(
        st.sampled_from(["version", "root_keys", "manifest_keys", "issued_at", "revoked"]), JSON
    )
)
def test_any_trust_update_is_refused(signed: Any) -> None:
    doc = {"signed": signed, "signatures": [{"key_id": ROOT_KEY.key_id, "sig": "AAAA"}]}
    with pytest.raises(ProtocolError):
        apply_trust_update(TRUST, parse_envelope(json.dumps(doc).encode()))


@FAST
@given(
    st.dictionaries(
        st.sampled_from(["command_id", "device_id", "type", "model", "issued_at", "expires_at"]),
        FINITE_JSON,
    )
)
def test_any_signed_command_of_the_wrong_shape_is_refused(signed: dict[str, Any]) -> None:
    envelope = sign_envelope(signed, MANIFEST_KEY).model_dump(mode="json")
    with pytest.raises(ProtocolError) as info:
        verify_command(json.dumps(envelope).encode(), TRUST, "dev-1", NOW)
    assert info.value.code in (Rejection.MALFORMED, Rejection.WRONG_TARGET, Rejection.EXPIRED)
