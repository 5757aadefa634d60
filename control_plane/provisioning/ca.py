"""A small certificate authority for a fleet's broker: device certificates (common name = device
id, client auth), the broker's server certificate, and a revocation list.

The CA's key and certificate are created on first use under ``<state_dir>/pki`` (key mode
0600). Every issued certificate is recorded (serial, common name) so a device's certificates can
be revoked by its id; the CRL lists them and Mosquitto refuses them (``crlfile``).
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.files import write_atomically

CA_LIFETIME = timedelta(days=3650)
CRL_LIFETIME = timedelta(days=90)
"""A CRL past its next update makes OpenSSL refuse every client: regenerate the broker config
(``edgefleet fleet mosquitto-config``) well within this."""


@dataclass(frozen=True)
class IssuedCert:
    common_name: str
    serial: int
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """Write ``<name>.pem`` and ``<name>.key`` (mode 0600); return their paths."""
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        write_atomically(cert, self.cert_pem)
        cert.chmod(0o644)
        write_atomically(key, self.key_pem)  # created 0600 by mkstemp
        return cert, key


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class FleetCA:
    def __init__(self, directory: Path, *, name: str = "edgefleet fleet CA") -> None:
        self.dir = directory
        self.cert_path = directory / "ca.pem"
        self._key_path = directory / "ca.key"
        self._ledger_path = directory / "issued.json"
        if not self.cert_path.is_file():
            self._create(name)
        key = serialization.load_pem_private_key(self._key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{self._key_path}: not an EC private key")
        self._key = key
        self.cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())

    def __repr__(self) -> str:  # keep the key out of logs and tracebacks
        return f"FleetCA({str(self.dir)!r})"

    def _create(self, name: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        fd = os.open(self._key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(_key_pem(key))
        write_atomically(self.cert_path, cert.public_bytes(serialization.Encoding.PEM))

    # -- issuing ----------------------------------------------------------------------------

    def issue(
        self, common_name: str, *, days: int = 365, server_names: list[str] | None = None
    ) -> IssuedCert:
        """A new key and certificate: for a client (a device, the control plane) or, with
        ``server_names`` (DNS names or IP addresses), for the broker."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server_names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(n) for n in server_names]),
                critical=False,
            )
        cert = builder.sign(self._key, hashes.SHA256())
        ledger = self._ledger()
        ledger[str(cert.serial_number)] = {"cn": common_name, "revoked_at": None}
        self._save_ledger(ledger)
        return IssuedCert(
            common_name,
            cert.serial_number,
            cert.public_bytes(serialization.Encoding.PEM),
            _key_pem(key),
        )

    # -- revocation -------------------------------------------------------------------------

    def revoke(self, common_name: str) -> int:
        """Revoke every certificate issued to ``common_name``; return how many."""
        ledger = self._ledger()
        now = datetime.now(UTC).isoformat()
        revoked = 0
        for entry in ledger.values():
            if entry["cn"] == common_name and entry["revoked_at"] is None:
                entry["revoked_at"] = now
                revoked += 1
        self._save_ledger(ledger)
        return revoked

    def holders(self) -> set[str]:
        """The common names that hold a certificate not revoked."""
        return {str(e["cn"]) for e in self._ledger().values() if e["revoked_at"] is None}

    def crl_pem(self, *, refused: Collection[str] = ()) -> bytes:
        """The CRL of the certificates revoked; ``refused``: also every certificate of these
        common names (a listener they must not log in on: the devices', for the control
        plane's user)."""
        now = datetime.now(UTC)
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.cert.subject)
            .last_update(now - timedelta(minutes=5))
            .next_update(now + CRL_LIFETIME)
        )
        for serial, entry in sorted(self._ledger().items()):
            revoked_at = entry["revoked_at"]
            if revoked_at is None and entry["cn"] in refused:
                revoked_at = now.isoformat()
            if revoked_at is not None:
                builder = builder.add_revoked_certificate(
                    x509.RevokedCertificateBuilder()
                    .serial_number(int(serial))
                    .revocation_date(datetime.fromisoformat(revoked_at))
                    .build()
                )
        return builder.sign(self._key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    def _ledger(self) -> dict[str, dict[str, str | None]]:
        if not self._ledger_path.is_file():
            return {}
        doc: dict[str, dict[str, str | None]] = json.loads(self._ledger_path.read_text())
        return doc

    def _save_ledger(self, ledger: dict[str, dict[str, str | None]]) -> None:
        write_atomically(self._ledger_path, json.dumps(ledger, indent=1, sort_keys=True).encode())


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)
