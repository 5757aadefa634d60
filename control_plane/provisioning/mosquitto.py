"""A fleet's broker access, kept under the control plane's state directory and written out as
Mosquitto configuration.

    <state_dir>/mqtt/passwd                    hashes of every device and service password
    <state_dir>/mqtt/<service>.password        a service user's password (mode 0600)
    <state_dir>/mqtt/<service>.pem / .key      a service user's client certificate (mTLS)
    <state_dir>/pki/                           the fleet CA (see :mod:`.ca`)

``write_config`` renders a directory Mosquitto can run from: ``mosquitto.conf`` (one listener),
``acl``, and either ``passwd`` (username and password) or the CA, the broker's certificate and
the CRL (mutual TLS, the username being the certificate's common name).
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path

from common.files import write_atomically
from common.protocol.topics import Topics, valid_device_id
from control_plane.provisioning.acl import CONTROL_PLANE_USER, RESERVED_USERS, render_acl
from control_plane.provisioning.ca import FleetCA, IssuedCert
from control_plane.provisioning.passwords import PasswordFile, hash_password, new_password


@dataclass(frozen=True)
class ServiceCredentials:
    user: str
    password_file: Path
    """Holds the password (mode 0600): point the service's settings at it, never log it."""
    cert: Path | None = None
    key: Path | None = None


def loopback_only(bind: str) -> bool:
    """Whether a listener bound to ``bind`` is reachable from this machine only."""
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:  # a host name: whatever it resolves to, not known to be loopback
        return False


class FleetAccess:
    def __init__(self, state_dir: Path, topics: Topics | None = None) -> None:
        self.state_dir = state_dir
        self.topics = topics or Topics()
        self.mqtt_dir = state_dir / "mqtt"
        self.passwords = PasswordFile.load(self.mqtt_dir / "passwd")
        self._ca: FleetCA | None = None

    @property
    def ca(self) -> FleetCA:
        if self._ca is None:  # created on first use only: password-only fleets need no CA
            self._ca = FleetCA(self.state_dir / "pki")
        return self._ca

    # -- devices ----------------------------------------------------------------------------

    def add_device(self, device_id: str) -> str:
        """Issue (or replace) a device's broker password; return it. Only its hash is kept."""
        _check_device_id(device_id)
        password = self.passwords.issue(device_id)
        self.passwords.save()
        return password

    def device_certificate(self, device_id: str, *, days: int = 365) -> IssuedCert:
        """Issue a client certificate whose common name is the device id."""
        _check_device_id(device_id)
        return self.ca.issue(device_id, days=days)

    def revoke_device(self, device_id: str) -> tuple[bool, int]:
        """Remove the device's password and revoke its certificates. Takes effect when the
        broker reloads the files written by :meth:`write_config` (SIGHUP or restart)."""
        removed = self.passwords.remove(device_id)
        self.passwords.save()
        certs = self.ca.revoke(device_id) if (self.state_dir / "pki").is_dir() else 0
        return removed, certs

    # -- service users ------------------------------------------------------------------------

    def service(self, user: str = CONTROL_PLANE_USER, *, tls: bool = False) -> ServiceCredentials:
        """The credentials of a service user, created on first use."""
        secret = self.mqtt_dir / f"{user}.password"
        if user not in self.passwords.entries or not secret.is_file():
            password = new_password()
            self.passwords.entries[user] = hash_password(password)
            self.passwords.save()
            write_atomically(secret, password.encode())  # mode 0600 (mkstemp)
        if not tls:
            return ServiceCredentials(user, secret)
        cert, key = self.mqtt_dir / f"{user}.pem", self.mqtt_dir / f"{user}.key"
        if not cert.is_file() or not key.is_file():
            self.ca.issue(user).write(self.mqtt_dir, user)
        return ServiceCredentials(user, secret, cert, key)

    # -- the broker's files -------------------------------------------------------------------

    def listener_options(self, out: Path, *, tls: bool) -> str:
        """What follows a ``listener`` line in mosquitto.conf for this fleet."""
        lines = [
            "allow_anonymous false",
            f"acl_file {out / 'acl'}",
            # the client id is the username: one device cannot take over another's session
            "use_username_as_clientid true",
        ]
        if tls:
            lines += [
                f"cafile {out / 'ca.pem'}",
                f"certfile {out / 'server.pem'}",
                f"keyfile {out / 'server.key'}",
                f"crlfile {out / 'crl.pem'}",
                "require_certificate true",
                "use_identity_as_username true",
                "tls_version tlsv1.2",
            ]
        else:
            lines.append(f"password_file {out / 'passwd'}")
        return "\n".join(lines) + "\n"

    def write_config(
        self,
        out: Path,
        *,
        port: int = 1883,
        bind: str = "0.0.0.0",
        tls: bool = False,
        server_names: tuple[str, ...] = ("localhost", "127.0.0.1"),
        owner: str | None = None,
    ) -> Path:
        """Write the broker's directory; return the path of its mosquitto.conf.

        Args:
            owner: the user Mosquitto runs as. Started as root, Mosquitto drops to that user
                (``user`` in the config, default ``mosquitto``) before it reads the password
                file, so the files are handed to it (they stay mode 0600).
        """
        out = out.resolve()  # mosquitto resolves relative paths against its own cwd
        out.mkdir(parents=True, exist_ok=True)
        self.service(CONTROL_PLANE_USER, tls=tls)
        write_atomically(out / "acl", render_acl(self.topics).encode())
        if tls:
            ca = self.ca
            shutil.copyfile(ca.cert_path, out / "ca.pem")
            ca.issue("edgefleet-broker", server_names=list(server_names)).write(out, "server")
            write_atomically(out / "crl.pem", ca.crl_pem())
        else:
            self.passwords.save(out / "passwd")
        conf = out / "mosquitto.conf"
        head = f"user {owner}\n" if owner else ""
        # the control plane acknowledges device messages once stored: a wide in-flight window
        # (its mqtt_broker_inflight setting must match) and room to queue while it restarts
        head += "max_inflight_messages 1000\nmax_queued_messages 100000\n"
        text = head + f"listener {port} {bind}\n" + self.listener_options(out, tls=tls)
        write_atomically(conf, text.encode())
        if owner:
            account = pwd.getpwnam(owner)
            for path in out.iterdir():
                os.chown(path, account.pw_uid, account.pw_gid)
        return conf


def _check_device_id(device_id: str) -> None:
    if not valid_device_id(device_id):
        raise ValueError(
            f"device id {device_id!r}: use letters, digits, '.', '_' or '-' (at most 128)"
        )
    if device_id in RESERVED_USERS:
        raise ValueError(f"device id {device_id!r} is reserved for a service user")
