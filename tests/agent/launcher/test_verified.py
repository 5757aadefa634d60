"""An agent release from the fleet: a signed manifest (common/protocol/agent_release.py) and a
``.tar.gz`` built at test time, installed only when the signature, window, target, sequence,
size, digest and the tree's own version all check out; each refusal names its code and leaves
nothing installed and nothing pending. Keys and the trust root are made per test."""

from __future__ import annotations

import hashlib
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.launcher.journal import load_pending
from agent.launcher.verified import install_verified, load_floor
from common.protocol.errors import ProtocolError, Rejection
from common.protocol.signing import SigningKey, sign_envelope
from common.protocol.verify import DeviceIdentity
from tests.agent.fleet.publisher import new_trust_root
from tests.agent.launcher.harness import build_release

DEVICE = DeviceIdentity("dev-1", "raspberry-pi-5", {"site": "lab"})
NOW = datetime.now(UTC)


def tarball(tmp_path: Path, version: str, inside: str | None = None) -> Path:
    tree = build_release(tmp_path, inside or version, "good")
    out = tmp_path / f"agent-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(tree, arcname=".")
    return out


def manifest(artifact: Path, version: str, sequence: int, **changes: Any) -> dict[str, Any]:
    body = {
        "kind": "agent_release",
        "version": version,
        "sequence": sequence,
        "artifact": {
            "name": artifact.name,
            "url": f"https://fleet.example/artifacts/{artifact.name}",
            "sha256": hashlib.sha256(artifact.read_bytes()).hexdigest(),
            "size": artifact.stat().st_size,
        },
        "target": {"labels": {"site": "lab"}},
        "issued_at": (NOW - timedelta(minutes=1)).isoformat(),
        "expires_at": (NOW + timedelta(days=1)).isoformat(),
    }
    body.update(changes)
    return body


@pytest.fixture
def keys() -> tuple[SigningKey, SigningKey]:
    return SigningKey.generate(), SigningKey.generate()  # root, manifest


def test_verified_release_installs_raises_the_floor_and_goes_pending(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey]
) -> None:
    root_key, manifest_key = keys
    trust = new_trust_root(root_key, [manifest_key])
    root = tmp_path / "launcher"
    artifact = tarball(tmp_path, "2.0.0")
    envelope = sign_envelope(manifest(artifact, "2.0.0", 7), manifest_key).model_dump(mode="json")
    verified, info = install_verified(envelope, artifact, trust, DEVICE, root, NOW)
    assert (verified.manifest.version, info.version) == ("2.0.0", "2.0.0")
    assert verified.signer == manifest_key.key_id
    assert (root / "releases" / "2.0.0" / "release.json").is_file()
    assert load_floor(root) == 7
    pending = load_pending(root)
    assert pending is not None and pending.version == "2.0.0"

    # the same sequence again (a replay), or an older one: refused before anything is read
    older = tarball(tmp_path, "1.9.0")
    for sequence in (7, 6):
        again = sign_envelope(manifest(older, "1.9.0", sequence), manifest_key)
        with pytest.raises(ProtocolError) as refused:
            install_verified(again.model_dump(mode="json"), older, trust, DEVICE, root, NOW)
        assert refused.value.code is Rejection.REPLAYED
        assert "not newer than sequence 7" in refused.value.message
    assert not (root / "releases" / "1.9.0").exists()


def cases(tmp_path: Path, good: SigningKey, other: SigningKey) -> list[tuple[Any, Path, Rejection]]:
    artifact = tarball(tmp_path, "3.0.0")
    body = manifest(artifact, "3.0.0", 1)
    tampered = sign_envelope(body, good).model_dump(mode="json")
    tampered["signed"]["sequence"] = 99
    liar = tarball(tmp_path, "3.0.1", inside="6.6.6")  # its release.json says another version
    short = tmp_path / "short.tar.gz"
    short.write_bytes(artifact.read_bytes()[:-10])
    swapped = tmp_path / "swapped.tar.gz"
    swapped.write_bytes(
        tarball(tmp_path, "3.0.2")
        .read_bytes()[: artifact.stat().st_size]
        .ljust(artifact.stat().st_size, b"\0")
    )
    return [
        (sign_envelope(body, other).model_dump(mode="json"), artifact, Rejection.UNKNOWN_KEY),
        (tampered, artifact, Rejection.BAD_SIGNATURE),
        (
            sign_envelope(
                manifest(
                    artifact,
                    "3.0.0",
                    1,
                    expires_at=(NOW - timedelta(hours=1)).isoformat(),
                    issued_at=(NOW - timedelta(hours=2)).isoformat(),
                ),
                good,
            ).model_dump(mode="json"),
            artifact,
            Rejection.EXPIRED,
        ),
        (
            sign_envelope(
                manifest(artifact, "3.0.0", 1, target={"labels": {"site": "b"}}), good
            ).model_dump(mode="json"),
            artifact,
            Rejection.WRONG_TARGET,
        ),
        (
            sign_envelope({**body, "kind": None}, good).model_dump(mode="json"),
            artifact,
            Rejection.MALFORMED,
        ),
        (sign_envelope(body, good).model_dump(mode="json"), short, Rejection.SIZE_MISMATCH),
        (sign_envelope(body, good).model_dump(mode="json"), swapped, Rejection.DIGEST_MISMATCH),
        (
            sign_envelope(manifest(liar, "3.0.1", 1), good).model_dump(mode="json"),
            liar,
            Rejection.MALFORMED,
        ),
    ]


def test_each_refusal_names_its_code_and_installs_nothing(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey]
) -> None:
    root_key, manifest_key = keys
    trust = new_trust_root(root_key, [manifest_key])
    root = tmp_path / "launcher"
    for envelope, artifact, code in cases(tmp_path, manifest_key, SigningKey.generate()):
        with pytest.raises(ProtocolError) as refused:
            install_verified(envelope, artifact, trust, DEVICE, root, NOW)
        assert refused.value.code is code, refused.value
        releases = root / "releases"
        assert not releases.exists() or list(releases.iterdir()) == [], code
        assert load_pending(root) is None and load_floor(root) is None
