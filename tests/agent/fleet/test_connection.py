"""Broker connections: username and password, TLS with a private CA, and what a refused
connection does (nothing but retry, and no secret in the logs)."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from tests.agent.fleet.conftest import fleet_settings
from tests.agent.fleet.publisher import Fleet
from tests.agent.server import copy_models, serve, wait_until
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
        tls_url = f"mqtts://127.0.0.1:{tls_broker.port}"
        settings = fleet_settings(
            fleet, tls_broker, tmp_path / "state", tls_ca_file=ca.cert_path, mqtt_url=tls_url
        )
        with serve(repo, fleet=settings) as agent:
            wait_until(lambda: agent.state.fleet.connected.is_set(), what="a TLS connection")  # type: ignore[union-attr]
        # without the CA, the broker's certificate is not trusted: no connection
        untrusted = fleet_settings(fleet, tls_broker, tmp_path / "state2", mqtt_url=tls_url)

        def refused() -> bool:
            errors = (str(r.__dict__.get("error")) for r in caplog.records)
            return any("CERTIFICATE_VERIFY_FAILED" in error for error in errors)

        with caplog.at_level(logging.WARNING), serve(repo, fleet=untrusted) as agent:
            wait_until(refused, what="the certificate to be refused")
            assert not agent.state.fleet.connected.is_set()  # type: ignore[union-attr]
    finally:
        tls_broker.stop()


def test_a_tls_file_missing_at_a_reconnect_is_retried_until_it_is_back(
    example_repo: Path, tmp_path: Path, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    ca = TestCA(tmp_path / "pki")
    server = ca.issue("broker", server=True)
    tls_broker = Mosquitto(
        tmp_path / "tls-broker",
        extra_config=f"allow_anonymous true\ncafile {ca.cert_path}\ncertfile {server.cert}\nkeyfile {server.key}\n",
    ).start()
    ca_file = tmp_path / "device-ca.pem"
    ca_file.write_bytes(ca.cert_path.read_bytes())
    try:
        repo = copy_models(example_repo, tmp_path / "repo", "mlp")
        tls_url = f"mqtts://127.0.0.1:{tls_broker.port}"
        settings = fleet_settings(
            fleet, tls_broker, tmp_path / "state", tls_ca_file=ca_file, mqtt_url=tls_url
        )
        with caplog.at_level(logging.WARNING), serve(repo, fleet=settings) as agent:
            client = agent.state.fleet
            assert client is not None
            wait_until(client.connected.is_set, what="a TLS connection")
            # a certificate rotation caught halfway: the file is gone when the link drops
            ca_file.rename(tmp_path / "rotating.pem")
            tls_broker.stop(kill=True)
            tls_broker.start()

            def logged() -> set[str]:
                return {r.message for r in caplog.records}

            wait_until(
                lambda: {"fleet session failed", "fleet client stopped"} & logged(),
                what="the failed attempt",
            )
            assert "fleet client stopped" not in logged()
            assert agent.client.get("/v2/health/ready").status_code == 200
            (tmp_path / "rotating.pem").rename(ca_file)
            wait_until(client.connected.is_set, what="the reconnection")
    finally:
        tls_broker.stop()
