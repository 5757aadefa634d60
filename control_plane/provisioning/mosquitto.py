"""A fleet's broker access, kept under the control plane's state directory and written out as
Mosquitto configuration.

    <state_dir>/mqtt/passwd                    hashes of every device and service password
    <state_dir>/mqtt/<service>.password        a service user's password (mode 0600)
    <state_dir>/mqtt/<service>.pem / .key      a service user's client certificate (mTLS)
    <state_dir>/pki/                           the fleet CA (see :mod:`.ca`)

``write_config`` renders a directory Mosquitto can run from: ``mosquitto.conf`` (persistence
and its pid file in ``data/``), ``acl``, and either ``passwd`` (username and password) or the
CA, the broker's certificate and the CRL (mutual TLS, the username being the certificate's
common name). It has two listeners (``per_listener_settings``): the devices' binds each client
id to its username (``use_username_as_clientid``: no device resumes or ends another's session),
and the control plane's, whose password file (``services.passwd``) holds the control plane's
user alone, takes any client id, so replicas sharing that user each keep a session of their own
(docs/scaling.md). It remembers that directory (``<state_dir>/mqtt/broker.json``),
so issuing or revoking a device afterwards rewrites the files there
(:meth:`FleetAccess.refresh_broker`); the broker rereads them on SIGHUP.

Started as root, Mosquitto reads its config, then drops to its ``user`` (``mosquitto`` unless the
config says otherwise) and only then opens the password file, the ACL, the certificates and its
persistence: those are handed to that user (:func:`default_owner`), and the directory must be
reachable by it.
"""

from __future__ import annotations

import grp
import ipaddress
import json
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


BROKER_CERT_NAME = "edgefleet-broker"
"""The common name of the broker's own (server) certificate."""
SERVICES_PASSWD = "services.passwd"
"""The control plane's listener's password file: the control plane's user only."""
SERVICES_ACL = "services.acl"
"""The control plane's listener's ACL: the control plane's user only."""
DEVICES_CRL = "devices-crl.pem"
"""The devices' listener's CRL: the revoked certificates, and the control plane's, which log in
on its own listener only."""
BROKER_USER = "mosquitto"
"""The user a Mosquitto started as root drops to when its config names none."""


def default_owner() -> str | None:
    """Who the broker's files are for when no owner is given: ``mosquitto`` when this runs as
    root (as does a broker started by root, which then drops to that user), else None: the
    broker runs as whoever runs this, and the files stay theirs.

    Raises:
        ValueError: running as root, and there is no ``mosquitto`` user here.
    """
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(BROKER_USER)
    except KeyError:
        raise ValueError(
            f"run as root, Mosquitto drops to the user {BROKER_USER!r}, which does not exist "
            "here: pass --owner USER, the user the broker is to run as"
        ) from None
    return BROKER_USER


def check_reachable(directory: Path, account: pwd.struct_passwd) -> None:
    """Raise ValueError unless ``account`` can reach files in ``directory`` (search permission
    on it and on every directory above it; those not created yet are left out)."""
    if account.pw_uid == 0:
        return
    groups = set(os.getgrouplist(account.pw_name, account.pw_gid))
    for path in (directory, *directory.parents):
        if not path.exists():
            continue
        st = path.stat()
        if st.st_uid == account.pw_uid:
            allowed = st.st_mode & 0o100
        elif st.st_gid in groups:
            allowed = st.st_mode & 0o010
        else:
            allowed = st.st_mode & 0o001
        if not allowed:
            group = grp.getgrgid(st.st_gid).gr_name if _has_group(st.st_gid) else st.st_gid
            raise ValueError(
                f"the broker, running as {account.pw_name}, could not reach {directory}: "
                f"{path} (mode {st.st_mode & 0o777:o}, group {group}) is closed to it; choose "
                "a directory it can reach (under /srv or /etc/mosquitto, say) or another --owner"
            )


def _has_group(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
    except KeyError:
        return False
    return True


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
        password = self.issue_device(device_id)
        self.passwords.save()
        return password

    def issue_device(self, device_id: str, password: str | None = None) -> str:
        """As :meth:`add_device`, not saved yet: many devices, then one ``passwords.save()``.
        ``password``: the one to give (None: a new random one)."""
        _check_device_id(device_id)
        return self.passwords.issue(device_id, password)

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
        """What follows the devices' ``listener`` line in mosquitto.conf for this fleet: the
        devices and the dashboard log in, never the control plane's user (its password is not
        in ``passwd``, its certificates are in ``devices-crl.pem``, its rules not in ``acl``)."""
        lines = [
            "allow_anonymous false",
            f"acl_file {out / 'acl'}",
            # the client id is the username: one device cannot take over another's session
            "use_username_as_clientid true",
        ]
        if tls:
            lines += [*_tls_options(out, DEVICES_CRL), "use_identity_as_username true"]
        else:
            lines.append(f"password_file {out / 'passwd'}")
        return "\n".join(lines) + "\n"

    def control_plane_listener_options(self, out: Path, *, tls: bool) -> str:
        """What follows the control plane's ``listener`` line: its user alone logs in (by
        password, and with TLS by a fleet certificate too), with any client id."""
        lines = ["allow_anonymous false", f"acl_file {out / SERVICES_ACL}"]
        lines += _tls_options(out, "crl.pem") if tls else []
        lines.append(f"password_file {out / SERVICES_PASSWD}")
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
        control_plane_port: int | None = None,
    ) -> Path:
        """Write the broker's directory; return the path of its mosquitto.conf.

        Args:
            control_plane_port: the control plane's listener (default ``port + 1``), on
                ``bind`` too.
            owner: the user Mosquitto runs as, when not the user running this (see
                :func:`default_owner`): written as its ``user`` setting, and the files are
                handed to it (they stay mode 0600).

        Raises:
            KeyError: no such ``owner``.
            PermissionError: handing files to ``owner`` needs root.
        """
        out = out.resolve()  # mosquitto resolves relative paths against its own cwd
        account = pwd.getpwnam(owner) if owner else None
        out.mkdir(parents=True, exist_ok=True)
        data = out / "data"
        data.mkdir(mode=0o700, exist_ok=True)
        self.service(CONTROL_PLANE_USER, tls=tls)
        if tls:
            ca = self.ca
            shutil.copyfile(ca.cert_path, out / "ca.pem")
            ca.issue(BROKER_CERT_NAME, server_names=list(server_names)).write(out, "server")
        conf = out / "mosquitto.conf"
        lines = [
            *broker_preamble(data, owner),
            # each listener its own password file: devices' client ids bound to their
            # usernames, the control plane's replicas each with a client id of its own
            "per_listener_settings true",
            "",
            "# devices (and dashboards: one session per username)",
            f"listener {port} {bind}",
            self.listener_options(out, tls=tls),
            "# the control plane: its user only, any client id (one per replica)",
            f"listener {control_plane_port or port + 1} {bind}",
            self.control_plane_listener_options(out, tls=tls),
        ]
        write_atomically(conf, "\n".join(lines).encode())
        self._write_access(out, tls=tls, topics=self.topics)
        if account is not None:
            for path in out.iterdir():
                os.chown(path, account.pw_uid, account.pw_gid)
        record = {"dir": str(out), "tls": tls, "owner": owner, "topic_prefix": self.topics.prefix}
        write_atomically(self.mqtt_dir / "broker.json", json.dumps(record, indent=1).encode())
        return conf

    def refresh_broker(self) -> Path | None:
        """Rewrite the password file (or the CRL) and the ACL in the broker directory that
        :meth:`write_config` wrote last, so the broker knows the devices issued or revoked
        since; return that directory (None: none written, or it is gone). The broker reads
        them again on SIGHUP."""
        record_path = self.mqtt_dir / "broker.json"
        if not record_path.is_file():
            return None
        record = json.loads(record_path.read_text())
        out = Path(record["dir"])
        if not (out / "mosquitto.conf").is_file():
            return None
        written = self._write_access(out, tls=record["tls"], topics=Topics(record["topic_prefix"]))
        if record["owner"]:
            account = pwd.getpwnam(record["owner"])
            for path in written:
                os.chown(path, account.pw_uid, account.pw_gid)
        return out

    def _devices(self) -> set[str]:
        """Every device issued a password or a certificate, and not revoked."""
        names = set(self.passwords.entries)
        if (self.state_dir / "pki").is_dir():
            names |= self.ca.holders() - {BROKER_CERT_NAME}
        return {n for n in names - RESERVED_USERS if valid_device_id(n)}

    def _write_access(self, out: Path, *, tls: bool, topics: Topics) -> list[Path]:
        """The files that change with the devices: the ACLs, and the password files or the
        CRLs. A directory whose mosquitto.conf predates the control plane's own ACL (both
        listeners read ``acl`` and ``passwd``) keeps the control plane's user in them."""
        conf = out / "mosquitto.conf"
        apart = not conf.is_file() or SERVICES_ACL in conf.read_text()
        # the devices' listener: the control plane's user is not in its files (apart)
        cp_users = () if apart else (CONTROL_PLANE_USER,)
        acl = render_acl(topics, devices=self._devices(), control_plane_users=cp_users)
        write_atomically(out / "acl", acl.encode())
        services_acl = render_acl(
            topics, control_plane_users=(CONTROL_PLANE_USER,), dashboard_users=(), patterns=False
        )
        write_atomically(out / SERVICES_ACL, services_acl.encode())
        services = self.passwords.only((CONTROL_PLANE_USER,), out / SERVICES_PASSWD)
        services.save()
        written = [out / "acl", out / SERVICES_ACL, services.path]
        if tls:
            write_atomically(out / "crl.pem", self.ca.crl_pem())
            refused = (CONTROL_PLANE_USER,) if apart else ()
            write_atomically(out / DEVICES_CRL, self.ca.crl_pem(refused=refused))
            return [*written, out / "crl.pem", out / DEVICES_CRL]
        users = tuple(u for u in self.passwords.entries if not (apart and u == CONTROL_PLANE_USER))
        devices = self.passwords.only(users, out / "passwd")
        devices.save()
        return [*written, devices.path]


def broker_preamble(data: Path, owner: str | None) -> list[str]:
    """The first lines of a fleet broker's mosquitto.conf, before its listeners: its user,
    persistence and pid file in ``data``, and the queues the control plane relies on."""
    lines = ["# Generated by `edgefleet fleet`; regenerate rather than edit."]
    lines += [f"user {owner}"] if owner else []
    return [
        *lines,
        # the control plane's messages queued for an offline device (and the devices' for
        # a restarting control plane) survive a broker restart (docs/operations.md)
        "persistence true",
        f"persistence_location {data}/",
        "autosave_interval 60",
        f"pid_file {data / 'mosquitto.pid'}",  # for a reload: kill -HUP $(cat ...)
        # the control plane acknowledges device messages once stored: a wide in-flight
        # window (its mqtt_broker_inflight setting must match) and room to queue while it
        # restarts
        "max_inflight_messages 1000",
        "max_queued_messages 100000",
    ]


def _tls_options(out: Path, crl: str) -> list[str]:
    return [
        f"cafile {out / 'ca.pem'}",
        f"certfile {out / 'server.pem'}",
        f"keyfile {out / 'server.key'}",
        f"crlfile {out / crl}",
        "require_certificate true",
        "tls_version tlsv1.2",
    ]


def _check_device_id(device_id: str) -> None:
    if not valid_device_id(device_id):
        raise ValueError(
            f"device id {device_id!r}: use letters, digits, '.', '_' or '-' (at most 128)"
        )
    if device_id in RESERVED_USERS:
        raise ValueError(f"device id {device_id!r} is reserved for a service user")
