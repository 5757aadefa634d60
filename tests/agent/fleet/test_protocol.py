"""The wire module on its own: canonical bytes, signatures, trust root rules, manifest checks,
topics, and the exported JSON Schemas."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from common.protocol.errors import ProtocolError, Rejection
from common.protocol.schemas import drift
from common.protocol.signing import (
    SigningKey,
    apply_trust_update,
    canonical_bytes,
    parse_envelope,
    sign_envelope,
    verify_signed,
)
from common.protocol.topics import Topics
from common.protocol.verify import DeviceIdentity, verify_command, verify_manifest
from tests.agent.fleet.publisher import new_trust_root

ROOT = Path(__file__).resolve().parents[3]
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DEVICE = DeviceIdentity("dev-1", "generic-x86_64", {"site": "lab"}, frozenset({"onnx", "tflite"}))
ROOT_KEY, MANIFEST_KEY = SigningKey.generate(), SigningKey.generate()
TRUST = new_trust_root(ROOT_KEY, [MANIFEST_KEY])


def manifest(**overrides: Any) -> dict[str, Any]:
    file = {"name": "model.onnx", "url": "http://127.0.0.1:1/x", "sha256": "a" * 64, "size": 10}
    doc: dict[str, Any] = {
        "schema_version": 1,
        "model": "mlp",
        "version": 2,
        "sequence": 7,
        "artifacts": [{"format": "onnx", "files": [file]}],
        "issued_at": NOW.isoformat(),
        "expires_at": (NOW + timedelta(hours=1)).isoformat(),
    }
    doc.update(overrides)
    return doc


def command(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema_version": 1,
        "command_id": "c1",
        "device_id": "dev-1",
        "type": "rollback",
        "model": "mlp",
        "issued_at": NOW.isoformat(),
        "expires_at": (NOW + timedelta(minutes=5)).isoformat(),
    }
    doc.update(overrides)
    return doc


def check(
    doc: dict[str, Any],
    *,
    key: SigningKey = MANIFEST_KEY,
    floor: int | None = None,
    trust: Any = TRUST,
) -> Any:
    return verify_manifest(
        sign_envelope(doc, key).model_dump(mode="json"), trust, DEVICE, lambda m: floor, NOW
    )


def rejected(code: Rejection, doc: dict[str, Any], **kwargs: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        check(doc, **kwargs)
    assert info.value.code == code, info.value
    return info.value


def test_canonical_bytes_are_order_independent_and_compact() -> None:
    assert (
        canonical_bytes({"b": 1, "a": [1, {"y": "é", "x": None}]})
        == b'{"a":[1,{"x":null,"y":"\xc3\xa9"}],"b":1}'
    )
    with pytest.raises(ValueError):
        canonical_bytes({"x": float("nan")})


def test_a_good_manifest_verifies_and_picks_its_variant() -> None:
    vm = check(manifest())
    assert (
        vm.manifest.sequence == 7
        and vm.variant.format == "onnx"
        and vm.signer == MANIFEST_KEY.key_id
    )


def test_signature_covers_the_bytes_received_so_newer_fields_still_verify() -> None:
    vm = check(manifest(future_field={"added": "by a newer control plane"}))
    assert vm.manifest.model == "mlp"


def test_each_rejection_has_its_code() -> None:
    rejected(Rejection.UNKNOWN_KEY, manifest(), key=SigningKey.generate())
    rejected(
        Rejection.REVOKED_KEY,
        manifest(),
        trust=TRUST.model_copy(update={"revoked": [MANIFEST_KEY.key_id]}),
    )
    day, hour = timedelta(days=1), timedelta(hours=1)
    expired = manifest(issued_at=(NOW - 2 * day).isoformat(), expires_at=(NOW - day).isoformat())
    rejected(Rejection.EXPIRED, expired)
    early = manifest(issued_at=(NOW + hour).isoformat(), expires_at=(NOW + 2 * hour).isoformat())
    rejected(Rejection.NOT_YET_VALID, early)
    error = rejected(Rejection.REPLAYED, manifest(), floor=7)
    assert (error.model, error.sequence) == ("mlp", 7)
    rejected(Rejection.WRONG_TARGET, manifest(target={"device_ids": ["dev-2"]}))
    rejected(Rejection.WRONG_TARGET, manifest(target={"labels": {"site": "plant"}}))
    rejected(Rejection.WRONG_TARGET, manifest(target={"profiles": ["raspberry-pi-5"]}))
    rejected(
        Rejection.NO_ARTIFACT,
        manifest(
            artifacts=[{"format": "openvino_ir", "files": manifest()["artifacts"][0]["files"]}]
        ),
    )
    rejected(Rejection.MALFORMED, manifest(version=0))
    rejected(Rejection.MALFORMED, manifest(expires_at=NOW.isoformat()))


def test_timestamps_without_a_time_zone_are_refused_as_malformed() -> None:
    naive = NOW.replace(tzinfo=None)
    naive_stamps = [
        {"issued_at": naive.isoformat()},
        {"expires_at": (naive + timedelta(hours=1)).isoformat()},
    ]
    for stamps in naive_stamps:
        error = rejected(Rejection.MALFORMED, manifest(**stamps))
        assert "time zone" in error.message and (error.model, error.sequence) == ("mlp", 7)
    cmd = command(issued_at=naive.isoformat())
    with pytest.raises(ProtocolError) as info:
        verify_command(
            sign_envelope(cmd, MANIFEST_KEY).model_dump(mode="json"), TRUST, "dev-1", NOW
        )
    assert info.value.code == Rejection.MALFORMED and "time zone" in info.value.message


def test_tampered_manifest_fails_its_signature() -> None:
    envelope = sign_envelope(manifest(), MANIFEST_KEY).model_dump(mode="json")
    envelope["signed"]["sequence"] = 8
    with pytest.raises(ProtocolError) as info:
        verify_manifest(envelope, TRUST, DEVICE, lambda m: None, NOW)
    assert (
        info.value.code == Rejection.BAD_SIGNATURE and info.value.sequence == 8
    )  # the claim, reported


def test_clock_skew_is_tolerated() -> None:
    check(manifest(issued_at=(NOW + timedelta(minutes=3)).isoformat()))


def test_profile_specific_variant_wins_over_a_generic_one() -> None:
    files = manifest()["artifacts"][0]["files"]
    generic = {"format": "onnx", "files": files}
    for_the_profile = {"format": "tflite", "profiles": ["generic-x86_64"], "files": files}
    doc = manifest(artifacts=[generic, for_the_profile])
    assert check(doc).variant.format == "tflite"


def test_envelope_parsing_refuses_garbage_and_other_schema_versions() -> None:
    cases = [
        (b"\xff\xfe", Rejection.MALFORMED),
        (b"[1]", Rejection.MALFORMED),
        (b'{"schema_version": 2, "signed": {}, "signatures": []}', Rejection.UNSUPPORTED_SCHEMA),
        (b'{"signed": {}, "signatures": []}', Rejection.MALFORMED),
    ]
    for raw, code in cases:
        with pytest.raises(ProtocolError) as info:
            parse_envelope(raw)
        assert info.value.code == code


def test_trust_update_rules() -> None:
    new_key = SigningKey.generate()
    v2 = new_trust_root(ROOT_KEY, [MANIFEST_KEY, new_key], version=2)
    assert (
        apply_trust_update(TRUST, sign_envelope(v2.model_dump(mode="json"), ROOT_KEY)).version == 2
    )
    with pytest.raises(ProtocolError) as info:  # signed by a manifest key, not a root key
        apply_trust_update(TRUST, sign_envelope(v2.model_dump(mode="json"), MANIFEST_KEY))
    assert info.value.code == Rejection.INSUFFICIENT_SIGNATURES
    with pytest.raises(ProtocolError) as info:  # not newer
        apply_trust_update(TRUST, sign_envelope(TRUST.model_dump(mode="json"), ROOT_KEY))
    assert info.value.code == Rejection.REPLAYED
    # rotating the root key itself needs the old root and the new root to sign
    new_root = SigningKey.generate()
    rotated = new_trust_root(new_root, [MANIFEST_KEY], version=2)
    with pytest.raises(ProtocolError):
        apply_trust_update(TRUST, sign_envelope(rotated.model_dump(mode="json"), ROOT_KEY))
    assert (
        apply_trust_update(
            TRUST, sign_envelope(rotated.model_dump(mode="json"), ROOT_KEY, new_root)
        ).version
        == 2
    )


def test_threshold_of_root_signatures() -> None:
    second = SigningKey.generate()
    two_of_two = new_trust_root(ROOT_KEY, [MANIFEST_KEY], root_keys=[ROOT_KEY, second]).model_copy(
        update={"root_threshold": 2}
    )
    v2 = two_of_two.model_copy(update={"version": 2})
    with pytest.raises(ProtocolError):
        apply_trust_update(two_of_two, sign_envelope(v2.model_dump(mode="json"), ROOT_KEY))
    assert (
        apply_trust_update(
            two_of_two, sign_envelope(v2.model_dump(mode="json"), ROOT_KEY, second)
        ).version
        == 2
    )


def test_commands_are_signed_targeted_and_expire() -> None:
    cmd = command()
    assert (
        verify_command(
            sign_envelope(cmd, MANIFEST_KEY).model_dump(mode="json"), TRUST, "dev-1", NOW
        ).model
        == "mlp"
    )
    hour = timedelta(hours=1)
    expired = command(expires_at=(NOW - hour).isoformat(), issued_at=(NOW - 2 * hour).isoformat())
    cases = [
        (command(device_id="dev-2"), MANIFEST_KEY, Rejection.WRONG_TARGET),
        (cmd, SigningKey.generate(), Rejection.UNKNOWN_KEY),
        (expired, MANIFEST_KEY, Rejection.EXPIRED),
    ]
    for doc, key, code in cases:
        with pytest.raises(ProtocolError) as info:
            verify_command(sign_envelope(doc, key).model_dump(mode="json"), TRUST, "dev-1", NOW)
        assert info.value.code == code


def test_signing_key_never_shows_its_secret() -> None:
    key = SigningKey.generate()
    pem = key.to_pem().decode()
    assert "PRIVATE KEY" in pem
    assert pem not in repr(key) and key.key_id in repr(key)
    assert SigningKey.from_pem(key.to_pem()).key_id == key.key_id
    assert (
        verify_signed(sign_envelope({"a": 1}, key), new_trust_root(ROOT_KEY, [key])) == key.key_id
    )


def test_topics() -> None:
    t = Topics("acme/edge")
    assert t.desired("dev-1") == "acme/edge/devices/dev-1/desired"
    assert t.parse("acme/edge/devices/dev-1/telemetry") == ("dev-1", "telemetry")
    assert (
        t.parse("acme/edge/devices/dev-1/x/y") is None and t.parse("other/devices/d/status") is None
    )
    foreign_topics = [
        "acme/edgex/devices/d/status",
        "acme/devices/d/status",
        "acme/edge/fleet/trust",
        "acme/edge/devices//status",
        "acme/edge/devices/dev 1/status",
    ]
    for foreign in foreign_topics:
        assert t.parse(foreign) is None, foreign
    for bad in ("a/b", "+", "#", "", "x" * 200, "dev 1"):
        with pytest.raises(ValueError):
            t.status(bad)


def test_exported_schemas_match_the_code() -> None:
    """Regenerate with: python -m common.protocol.schemas docs/schemas"""
    assert drift(ROOT / "docs/schemas") == []


def test_exported_schemas_are_valid_json_schema_documents() -> None:
    for path in (ROOT / "docs/schemas").glob("*.json"):
        doc = json.loads(path.read_text())
        assert doc["$id"].endswith(path.name) and doc["type"] == "object"
