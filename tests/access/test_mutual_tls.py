"""Mutual TLS: the control plane's CA issues device certificates (CN = device id) and the
broker's; a real Mosquitto requires a client certificate and takes the username from it, so the
same ACL confines each device. Certificates from another CA, none at all, or revoked ones are
refused; a real control plane and agent talk with theirs."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from control_plane.provisioning.acl import CONTROL_PLANE_USER
from control_plane.provisioning.mosquitto import FleetAccess
from tests.access.fleet_broker import FleetBroker, on_control_plane_listener
from tests.access.metrics import value
from tests.access.mqtt_client import NOT_AUTHORIZED, ProbeClient
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.test_rollouts import wait_devices
from tests.tls import TestCA

T = "edgefleet/devices"
# NOTE: paho-mqtt leaves the socket open when the TLS handshake fails (see test_connection.py).
pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path}/control-plane.db"


@pytest.fixture
def access(tmp_path: Path) -> FleetAccess:
    return FleetAccess(tmp_path / "cp-state")


@pytest.fixture
def certs(tmp_path: Path, access: FleetAccess) -> dict[str, tuple[Path, Path]]:
    issued = {
        d: access.device_certificate(d).write(tmp_path / "devices", d)
        for d in ("dev-a", "dev-b", "dev-c")
    }
    access.revoke_device("dev-c")  # before the broker's config is written: in its CRL
    return issued


@pytest.fixture
def broker(
    tmp_path: Path, access: FleetAccess, certs: dict[str, tuple[Path, Path]]
) -> Iterator[FleetBroker]:
    out = tmp_path / "broker-config"
    access.write_config(out, tls=True, server_names=("127.0.0.1", "localhost"))
    mosquitto = FleetBroker(tmp_path / "broker", access, out, tls=True)
    yield mosquitto.start()
    mosquitto.stop()


@pytest.fixture
def start_control_plane(tmp_path: Path, db_url: str, broker: FleetBroker) -> ControlPlaneFactory:
    return on_control_plane_listener(tmp_path, db_url, broker)


def test_certificates_carry_the_device_id_and_the_broker_names(
    access: FleetAccess, certs: dict[str, tuple[Path, Path]], tmp_path: Path, broker: FleetBroker
) -> None:
    cert = x509.load_pem_x509_certificate(certs["dev-a"][0].read_bytes())
    assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "dev-a"
    assert cert.issuer == access.ca.cert.subject
    assert (certs["dev-a"][1].stat().st_mode & 0o777) == 0o600
    assert (access.state_dir / "pki" / "ca.key").stat().st_mode & 0o777 == 0o600
    server = x509.load_pem_x509_certificate(
        (tmp_path / "broker-config" / "server.pem").read_bytes()
    )
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(n.value) for n in names} == {"127.0.0.1", "localhost"}
    crl = x509.load_pem_x509_crl((tmp_path / "broker-config" / "crl.pem").read_bytes())
    revoked = x509.load_pem_x509_certificate(certs["dev-c"][0].read_bytes())
    assert crl.get_revoked_certificate_by_serial_number(revoked.serial_number) is not None
    assert crl.get_revoked_certificate_by_serial_number(cert.serial_number) is None


def test_broker_requires_a_certificate_from_the_fleet_ca(
    broker: FleetBroker, access: FleetAccess, certs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    ca = access.ca.cert_path
    service = access.service(CONTROL_PLANE_USER, tls=True)
    other_ca = TestCA(tmp_path / "other-ca").issue("dev-a")  # right name, wrong issuer
    refused = [
        ProbeClient(broker.port, ca=ca),  # no client certificate
        ProbeClient(broker.port, ca=ca, cert=other_ca.cert, key=other_ca.key),
        ProbeClient(broker.port, ca=ca, cert=certs["dev-c"][0], key=certs["dev-c"][1]),  # revoked
    ]
    # the control plane's certificate, on the devices' listener: in its CRL (issue 47)
    refused.append(ProbeClient(broker.port, ca=ca, cert=service.cert, key=service.key))
    # its own listener takes its certificate and its password (services.passwd)
    login = {"username": CONTROL_PLANE_USER, "password": service.password_file.read_text()}
    fleet = ProbeClient(broker.cp_port, ca=ca, cert=service.cert, key=service.key, **login)
    a = ProbeClient(broker.port, ca=ca, cert=certs["dev-a"][0], key=certs["dev-a"][1])
    try:
        for probe in refused:
            assert probe.connect() is None  # the TLS handshake fails: no CONNACK at all
        assert fleet.connect() == 0 and a.connect() == 0
        assert [rc.value for rc in fleet.subscribe(f"{T}/+/telemetry")] == [1]
        # the username is the certificate's CN: the ACL confines dev-a to its own subtree
        for topic in (
            f"{T}/dev-b/telemetry",
            f"{T}/dev-b/status",
            f"{T}/dev-a/desired",
            "edgefleet/fleet/trust",
        ):
            assert a.publish(topic, b"forged").value == NOT_AUTHORIZED, topic
        assert a.publish(f"{T}/dev-a/telemetry", b"mine").value == 0
        fleet.wait(lambda: fleet.messages(f"{T}/dev-a/telemetry"), "dev-a's telemetry")
        assert {t for t, _, _ in fleet.received} == {f"{T}/dev-a/telemetry"}
        a.subscribe(f"{T}/dev-b/desired")
        assert not fleet.publish(f"{T}/dev-b/desired", b"for b", retain=True).is_failure
        assert not fleet.publish(f"{T}/dev-a/desired", b"for a", retain=True).is_failure
        a.subscribe(f"{T}/dev-a/desired")
        a.wait(lambda: a.messages(f"{T}/dev-a/desired"), "dev-a's desired state")
        assert {t for t, _, _ in a.received} == {f"{T}/dev-a/desired"}
    finally:
        for client in (fleet, a, *refused):
            client.close()


def test_real_control_plane_and_agent_over_mutual_tls(
    start_control_plane: ControlPlaneFactory,
    start_agent: AgentFactory,
    access: FleetAccess,
    certs: dict[str, tuple[Path, Path]],
) -> None:
    ca = access.ca.cert_path
    service = access.service(CONTROL_PLANE_USER, tls=True)
    cp_tls = {
        "mqtt_username": CONTROL_PLANE_USER,
        "mqtt_password_file": service.password_file,
        "mqtt_tls_ca_file": ca,
        "mqtt_tls_cert_file": service.cert,
        "mqtt_tls_key_file": service.key,
    }
    cert, key = certs["dev-a"]
    with (
        start_control_plane(**cp_tls) as cp,
        start_agent("dev-a", cp, tls_ca_file=ca, tls_cert_file=cert, tls_key_file=key) as agent,
    ):
        wait_devices(cp, "dev-a")  # the birth message, device -> control plane
        stored = lambda: value(cp.admin.get("/metrics").text, "edgefleet_telemetry_messages_total")  # noqa: E731
        wait_until(lambda: stored() > 0, what="telemetry over mutual TLS")
        assert cp.admin.post("/api/v1/keys/rotate").status_code == 200  # control plane -> device
        wait_until(lambda: agent.state.fleet.trust.version == 2, what="trust root 2 on the device")  # type: ignore[union-attr]


def test_a_certificate_revoked_later_is_refused_after_a_reload(
    broker: FleetBroker, access: FleetAccess, certs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    ca, (cert, key) = access.ca.cert_path, certs["dev-b"]
    before = ProbeClient(broker.port, ca=ca, cert=cert, key=key)
    assert before.connect() == 0
    before.close()
    assert access.revoke_device("dev-b") == (False, 1)  # no password: certificates only
    access.write_config(tmp_path / "broker-config", tls=True, server_names=("127.0.0.1",))
    assert broker.proc is not None
    broker.proc.send_signal(signal.SIGHUP)  # mosquitto rereads its TLS files and the CRL

    def refused() -> bool:
        probe = ProbeClient(broker.port, ca=ca, cert=cert, key=key)
        try:
            return probe.connect() is None
        finally:
            probe.close()

    wait_until(refused, what="the revoked certificate to be refused")
    a = ProbeClient(broker.port, ca=ca, cert=certs["dev-a"][0], key=certs["dev-a"][1])
    assert a.connect() == 0
    a.close()
