"""No secret in any log: the full demo (broker with per-device passwords, control plane, two
agents, two rollouts) runs with DEBUG logging in every process, and every line any of them
wrote is scanned for the signing keys, the API token and the MQTT passwords, in every encoding
they could take."""

from __future__ import annotations

import base64
import re
import tomllib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.agent.test_cli import edgefleet


def key_needles(pem: bytes) -> list[str]:
    """A private key as a PEM body, and its raw bytes in hex and base64 (standard and URL-safe,
    with and without padding)."""
    body = "".join(line for line in pem.decode().splitlines() if not line.startswith("-----"))
    key = serialization.load_pem_private_key(pem, password=None)
    assert isinstance(key, Ed25519PrivateKey)
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    b64, url = base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()
    return [body, raw.hex(), raw.hex().upper(), b64, b64.rstrip("="), url, url.rstrip("=")]


def secret_needles(text: str) -> list[str]:
    return [text, base64.b64encode(text.encode()).decode()]


@pytest.mark.slow
def test_demo_at_debug_level_logs_no_secret(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    result = edgefleet("demo", "--workdir", str(workdir), "--log-level", "DEBUG", check=False)
    assert result.returncode == 0 and result.stdout.rstrip().endswith("== done"), result.stdout[
        -3000:
    ]
    logs = {p.name: p.read_text() for p in (workdir / "logs").iterdir()}
    logs |= {"demo stdout": result.stdout, "demo stderr": result.stderr}
    assert set(logs) >= {"mosquitto.log", "control-plane.log", "edge-x86.log", "edge-pi.log"}
    # every process did log at debug level, and the broker checked passwords
    for name in ("control-plane.log", "edge-x86.log", "edge-pi.log"):
        assert '"level": "DEBUG"' in logs[name], name
    assert "Sending PUBACK" in logs["mosquitto.log"] and "u'edge-x86'" in logs["mosquitto.log"]

    cp = workdir / "control-plane"
    secrets: dict[str, list[str]] = {}
    for pem in sorted((cp / "keys").glob("*.pem")):  # the manifest and root signing keys
        secrets[f"signing key {pem.name}"] = key_needles(pem.read_bytes())
    token = (cp / "admin-token").read_text().strip()
    secrets["admin API token"] = secret_needles(token) + [token.split("_", 2)[2]]
    cp_config = tomllib.loads((workdir / "control-plane.toml").read_text())
    secrets["control plane MQTT password"] = secret_needles(cp_config["mqtt_password"])
    for device in ("edge-x86", "edge-pi"):
        fleet = tomllib.loads((workdir / device / "agent.toml").read_text())["fleet"]
        secrets[f"{device} MQTT password"] = secret_needles(fleet["password"])
    assert len(secrets) == 6 and all(len(n[0]) >= 32 for n in secrets.values())

    leaks = [
        f"{what} in {name}, line {text[: text.index(needle)].count(chr(10)) + 1}"
        for what, needles in secrets.items()
        for needle in needles
        for name, text in logs.items()
        if needle in text
    ]
    assert not leaks, leaks
    # the broker's files hold password hashes only
    passwd = (workdir / "broker" / "passwd").read_text()
    assert all(
        re.fullmatch(r"[\w.-]+:\$7\$101\$[^$]+\$[^$]+", line) for line in passwd.splitlines()
    )
    assert not any(
        n in passwd for what, needles in secrets.items() if "MQTT" in what for n in needles
    )
    # and nothing went wrong that a debug run would have hidden
    assert "telemetry batch not stored" not in logs["control-plane.log"]
