"""Broker connections: username and password, TLS with a private CA, and what a refused
connection does (nothing but retry, and no secret in the logs)."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from tests.agent.server import copy_models, serve, wait_until
from tests.fleet.conftest import fleet_settings
from tests.fleet.publisher import Fleet
from tests.mqtt_broker import Mosquitto
from tests.tls import TestCA


def _password_file(path: Path, users: dict[str, str]) -> Path:
    path.write_text("")
    for user, password in users.items():
        subprocess.run(["mosquitto_passwd", "-b", str(path), user, password], check=True)
    return path


def test_username_and_password(
    example_repo: Path, tmp_path: Path, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    passwords = _password_file(tmp_path / "passwd", {"dev-1": "s3cret-dev-1"})
    broker = Mosquitto(
        tmp_path / "auth-broker", extra_config=f"allow_anonymous false\npassword_file {passwords}\n"
    ).start()
    try:
        repo = copy_models(example_repo, tmp_path / "repo", "mlp")
        good = fleet_settings(
            fleet, broker, tmp_path / "state", username="dev-1", password="s3cret-dev-1"
        )
        with serve(repo, fleet=good) as agent:
            wait_until(
                lambda: agent.state.fleet.connected.is_set(), what="an authenticated connection"
            )  # type: ignore[union-attr]
        bad = fleet_settings(
            fleet, broker, tmp_path / "state2", username="dev-1", password="wrong-password-xyz"
        )
        with caplog.at_level(logging.DEBUG), serve(repo, fleet=bad) as agent:
            wait_until(
                lambda: any("broker connection lost" in r.message for r in caplog.records),
                what="a refusal",
            )
            assert not agent.state.fleet.connected.is_set()  # type: ignore[union-attr]
            assert (
                agent.client.get("/v2/health/ready").status_code == 200
            )  # serving locally regardless
        logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
        assert "wrong-password-xyz" not in logged and "s3cret-dev-1" not in logged
    finally:
        broker.stop()


# NOTE: paho-mqtt's _ssl_wrap_socket leaves the socket open when the TLS handshake fails;
# CPython closes it when collected, which warns. Not a descriptor leak, an upstream nit.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_tls_with_a_private_ca(
    example_repo: Path, tmp_path: Path, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    ca = TestCA(tmp_path / "pki")
    server = ca.issue("broker", server=True)
    tls_broker = Mosquitto(
        tmp_path / "tls-broker",
        extra_config=f"allow_anonymous true\ncafile {ca.cert_path}\ncertfile {server.cert}\nkeyfile {server.key}\n",
    ).start()
    try:
        repo = copy_models(example_repo, tmp_path / "repo", "mlp")
        settings = fleet_settings(fleet, tls_broker, tmp_path / "state", tls_ca_file=ca.cert_path,
                                  mqtt_url=f"mqtts://127.0.0.1:{tls_broker.port}")  # fmt: skip
        with serve(repo, fleet=settings) as agent:
            wait_until(lambda: agent.state.fleet.connected.is_set(), what="a TLS connection")  # type: ignore[union-attr]
        # without the CA, the broker's certificate is not trusted: no connection
        untrusted = fleet_settings(
            fleet, tls_broker, tmp_path / "state2", mqtt_url=f"mqtts://127.0.0.1:{tls_broker.port}"
        )
        with caplog.at_level(logging.WARNING), serve(repo, fleet=untrusted) as agent:
            wait_until(lambda: any("CERTIFICATE_VERIFY_FAILED" in str(r.__dict__.get("error")) for r in caplog.records),
                       what="the certificate to be refused")  # fmt: skip
            assert not agent.state.fleet.connected.is_set()  # type: ignore[union-attr]
    finally:
        tls_broker.stop()
