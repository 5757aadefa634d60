"""``edgefleet fleet``: a fleet's broker and control plane set up in one directory (``init``), and
broker credentials, kept in the control plane's state directory (``--state-dir``, or
``EDGEFLEET_CP_STATE_DIR``)."""

from __future__ import annotations

import functools
import json
import pwd
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import click

if TYPE_CHECKING:
    from control_plane.provisioning.mosquitto import FleetAccess

F = TypeVar("F", bound=Callable[..., Any])

STATE_DIR = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="EDGEFLEET_CP_STATE_DIR",
    default=Path("var/control-plane"),
    show_default=True,
    help="The control plane's state directory (credentials live under mqtt/ and pki/).",
)
PORT = click.IntRange(1, 65535)


def broker_options(bind_default: str, *, dashboard_default: bool) -> Callable[[F], F]:
    """The options of the broker's config, shared by ``mosquitto-config`` and ``init``."""
    options = [
        click.option("--bind", default=bind_default, show_default=True),
        click.option(
            "--control-plane-port",
            type=PORT,
            help="The control plane's listener, where replicas sharing its user each keep a "
            "session of their own (default: the devices' port + 1).",
        ),
        click.option(
            "--tls", is_flag=True, help="Mutual TLS: clients authenticate by certificate."
        ),
        click.option(
            "--allow-plaintext",
            is_flag=True,
            help="Without --tls, listen beyond loopback anyway: device passwords and model "
            "manifests then cross the network unencrypted.",
        ),
        click.option(
            "--server-name",
            "server_names",
            multiple=True,
            default=("localhost", "127.0.0.1"),
            show_default=True,
            help="DNS name or IP address of the broker, for its certificate (repeatable).",
        ),
        click.option("--topic-prefix", default="edgefleet", show_default=True),
        click.option(
            "--owner",
            help="The user the broker runs as (its `user` setting), who gets its files. "
            "Default: mosquitto when run as root (Mosquitto started by root drops to it before "
            "it reads them), else whoever runs this.",
        ),
        click.option(
            "--dashboard/--no-dashboard",
            default=dashboard_default,
            show_default=True,
            help="A read-only user for dashboards (device reports).",
        ),
    ]

    def apply(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


def check_listener(bind: str, tls: bool, allow_plaintext: bool) -> None:
    from control_plane.provisioning.mosquitto import loopback_only

    if not tls and not allow_plaintext and not loopback_only(bind):
        # Security by default: a fleet's broker reached over the network carries device
        # passwords in every CONNECT; in clear they are anyone's on the path.
        raise click.UsageError(
            f"--bind {bind} without --tls would send device passwords unencrypted over the "
            "network: add --tls (mutual TLS), --bind 127.0.0.1 for a broker only this "
            "machine reaches, or --allow-plaintext if the network is trusted"
        )


def _control_plane_port(port: int, given: int | None) -> int:
    """The control plane's listener: ``given``, or the devices' ``port`` + 1."""
    chosen = given or port + 1
    if chosen == port or chosen > 65535:
        raise click.UsageError(
            f"the control plane's listener needs a port of its own, not {chosen}: "
            "pass --control-plane-port"
        )
    return chosen


def write_broker(
    access: FleetAccess,
    out: Path,
    *,
    port: int,
    bind: str,
    tls: bool,
    server_names: tuple[str, ...],
    owner: str | None,
    dashboard: bool,
    must_reach: bool,
    control_plane_port: int | None,
) -> Path:
    """``access.write_config`` with its failures as one line; return the mosquitto.conf.

    Args:
        must_reach: refuse (before writing anything) a directory the broker's user could not
            reach; else only warn, for files that are to be moved where it can.
    """
    from control_plane.provisioning.acl import DASHBOARD_USER
    from control_plane.provisioning.mosquitto import check_reachable, default_owner

    try:
        owner = owner or default_owner()
        account = pwd.getpwnam(owner) if owner else None
    except KeyError as exc:
        raise click.ClickException(f"--owner {owner}: no such user") from exc
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if account is not None and must_reach:
        try:
            check_reachable(out.resolve(), account)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    if dashboard:
        reader = access.service(DASHBOARD_USER, tls=tls)
        click.echo(f"dashboard: username {reader.user!r}, password in {reader.password_file}")
    try:
        conf = access.write_config(
            out,
            port=port,
            bind=bind,
            tls=tls,
            server_names=server_names,
            owner=owner,
            control_plane_port=control_plane_port,
        )
    except PermissionError as exc:  # chown needs root
        raise click.ClickException(f"--owner {owner}: {exc}") from exc
    if account is not None and not must_reach:
        try:
            check_reachable(conf.parent, account)
        except ValueError as exc:
            click.echo(f"Warning: {exc}", err=True)
    return conf


def _refresh(access: FleetAccess) -> None:
    """After a device was issued or revoked: the broker's files, where they were written."""
    try:
        out = access.refresh_broker()
    except (KeyError, PermissionError) as exc:  # the recorded owner; chown needs root
        raise click.ClickException(f"could not update the broker's files: {exc}") from exc
    if out is not None:
        click.echo(
            f"updated the broker's files in {out}; reload the broker to apply them: "
            f'kill -HUP "$(cat {out / "data" / "mosquitto.pid"})"',
            err=True,
        )


def os_failures(command: F) -> F:
    """``command`` with an OSError (a directory that is a file, no permission) as one
    ``Error:`` line naming the path."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BrokenPipeError:
            raise  # click's own: the reader went away
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            raise click.ClickException(f"{where}{exc.strerror or exc}") from exc

    return run  # type: ignore[return-value]


@click.group("fleet")
def fleet() -> None:
    """A fleet's broker and control plane (init); device credentials, certificates,
    Mosquitto password file and ACL."""


@click.command("add-device")
@click.argument("device_id")
@click.option(
    "--cert-out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Also issue a client certificate (CN = device id) and write it, its key and the "
    "CA certificate here, for a broker that requires mutual TLS.",
)
@click.option("--json", "as_json", is_flag=True, help="Print {device_id, password, cert_out}.")
@STATE_DIR
@os_failures
def add_device(device_id: str, cert_out: Path | None, as_json: bool, state_dir: Path) -> None:
    """Issue DEVICE_ID's broker password (printed once; only its hash is kept). The broker's
    files written by `init` or `mosquitto-config` are updated: reload the broker."""
    from control_plane.enrolment.identity import LOCK_FILE, file_lock
    from control_plane.provisioning.mosquitto import FleetAccess

    # the control plane enrolling devices meanwhile writes the same files
    with file_lock(state_dir / "mqtt" / LOCK_FILE):
        access = FleetAccess(state_dir)
        try:
            password = access.add_device(device_id)
            if cert_out is not None:
                cert, key = access.device_certificate(device_id).write(cert_out, device_id)
                (cert_out / "ca.pem").write_bytes(access.ca.cert_path.read_bytes())
                click.echo(f"certificate {cert}, key {key}, CA {cert_out / 'ca.pem'}", err=True)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        _refresh(access)
    if as_json:
        doc = {"device_id": device_id, "password": password, "cert_out": cert_out}
        click.echo(json.dumps(doc, indent=2, default=str))
        return
    click.echo(password)


@click.command("revoke-device")
@click.argument("device_id")
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
@STATE_DIR
@os_failures
def revoke_device(device_id: str, as_json: bool, state_dir: Path) -> None:
    """Remove DEVICE_ID's password and revoke its certificates, in the broker's files too
    (where `init` or `mosquitto-config` wrote them); then reload the broker."""
    from control_plane.enrolment.identity import LOCK_FILE, file_lock
    from control_plane.provisioning.mosquitto import FleetAccess

    with file_lock(state_dir / "mqtt" / LOCK_FILE):
        access = FleetAccess(state_dir)
        removed, certs = access.revoke_device(device_id)
        if not removed and not certs:
            raise click.ClickException(f"no credentials for device {device_id}")
        _refresh(access)
    if as_json:
        doc = {"device_id": device_id, "password_removed": removed, "certificates": certs}
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(
        f"{device_id}: password {'removed' if removed else 'none'}, {certs} certificate(s) revoked"
    )


@click.command("dynsec-config")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--port", type=PORT, default=1883, show_default=True, help="The devices'.")
@click.option(
    "--control-plane-port",
    type=PORT,
    help="The control plane's listener, the only one its user logs in on (default: the "
    "devices' port + 1).",
)
@click.option("--bind", default="127.0.0.1", show_default=True)
@click.option(
    "--allow-plaintext",
    is_flag=True,
    help="Listen beyond loopback without TLS: device passwords then cross the network "
    "unencrypted (add TLS to both listeners instead: docs/security.md).",
)
@click.option("--topic-prefix", default="edgefleet", show_default=True)
@click.option(
    "--plugin",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The plugin's library (default: the mosquitto_dynamic_security.so found here).",
)
@click.option(
    "--owner",
    help="The user the broker runs as (its `user` setting), who gets its files (default: "
    "mosquitto when run as root, else whoever runs this).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an existing plugin file, and every user the broker kept in it.",
)
@STATE_DIR
@os_failures
def dynsec_config(out: Path, port: int, **opts: Any) -> None:
    """Write a broker directory whose device accounts are Mosquitto's dynamic security
    plugin's, made by the control plane as devices enrol by claim (docs/enrolment.md): the
    control plane's user, kept apart on a listener of its own, administers the plugin. An
    existing plugin file (data/dynamic-security.json) is kept unless --force."""
    from common.protocol.topics import Topics
    from control_plane.provisioning.acl import CONTROL_PLANE_USER
    from control_plane.provisioning.dynsec_broker import find_plugin, write_dynsec_broker
    from control_plane.provisioning.mosquitto import FleetAccess, check_reachable, default_owner

    check_listener(opts["bind"], False, opts["allow_plaintext"])
    cp_port = _control_plane_port(port, opts["control_plane_port"])
    plugin = opts["plugin"] or find_plugin()
    if plugin is None:
        raise click.ClickException(
            "no mosquitto_dynamic_security.so here (`dpkg -L mosquitto | grep dynamic`): "
            "pass --plugin PATH, where the broker's machine has it"
        )
    access = FleetAccess(opts["state_dir"], Topics(opts["topic_prefix"]))
    try:
        owner = opts["owner"] or default_owner()
        written = write_dynsec_broker(
            access,
            out,
            port=port,
            control_plane_port=cp_port,
            bind=opts["bind"],
            plugin=plugin,
            owner=owner,
            force=opts["force"],
        )
    except KeyError as exc:
        raise click.ClickException(f"--owner {opts['owner']}: no such user") from exc
    except (ValueError, PermissionError) as exc:  # no mosquitto user; chown needs root
        raise click.ClickException(str(exc)) from exc
    service = access.service(CONTROL_PLANE_USER)
    click.echo(f"wrote {written.conf}")
    if owner is not None:
        try:  # the broker, dropped to its user, then reads and writes here
            check_reachable(written.conf.parent, pwd.getpwnam(owner))
        except ValueError as exc:
            click.echo(f"Warning: {exc}", err=True)
    if written.kept:
        click.echo(f"kept {written.plugin_file} and its users (--force replaces it)", err=True)
    if written.holds_control_plane:
        click.echo(_KEPT_CONTROL_PLANE.format(port=cp_port, secret=service.password_file), err=True)
    click.echo(
        f"control plane: port {cp_port} (devices: {port}), mqtt_username = {service.user!r}, "
        f'mqtt_password_file = {service.password_file}, enrolment.accounts = "dynsec"'
    )


_KEPT_CONTROL_PLANE = (
    "Warning: the kept plugin file has a user edgefleet-control-plane, which logs in on the "
    "devices' listener too: once the broker runs this config, delete it (the control plane "
    "then logs in through services.passwd, with the same password): mosquitto_ctrl -p {port} "
    '-u edgefleet-control-plane -P "$(cat {secret})" dynsec deleteClient '
    "edgefleet-control-plane"
)


@click.command("mosquitto-config")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--port", type=PORT, default=1883, show_default=True)
@broker_options(bind_default="0.0.0.0", dashboard_default=False)
@STATE_DIR
@os_failures
def mosquitto_config(
    out: Path,
    port: int,
    bind: str,
    tls: bool,
    allow_plaintext: bool,
    server_names: tuple[str, ...],
    topic_prefix: str,
    owner: str | None,
    dashboard: bool,
    control_plane_port: int | None,
    state_dir: Path,
) -> None:
    """Write mosquitto.conf, the ACL and the password file (or, with --tls, the CA, the
    broker certificate and the CRL) for every device issued so far."""
    from common.protocol.topics import Topics
    from control_plane.provisioning.acl import CONTROL_PLANE_USER
    from control_plane.provisioning.mosquitto import FleetAccess

    check_listener(bind, tls, allow_plaintext)
    control_plane_port = _control_plane_port(port, control_plane_port)
    access = FleetAccess(state_dir, Topics(topic_prefix))
    conf = write_broker(
        access,
        out,
        port=port,
        bind=bind,
        tls=tls,
        server_names=server_names,
        owner=owner,
        dashboard=dashboard,
        must_reach=False,
        control_plane_port=control_plane_port,
    )
    service = access.service(CONTROL_PLANE_USER, tls=tls)
    click.echo(f"wrote {conf}")
    click.echo(
        f"control plane: port {control_plane_port} (devices: {port}), "
        f"mqtt_username = {service.user!r}, mqtt_password_file = {service.password_file}"
    )
    if service.cert is not None:
        click.echo(
            f"control plane: mqtt_tls_cert_file = {service.cert}, mqtt_tls_key_file = {service.key}"
        )


@click.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--mqtt-port", type=PORT, default=1883, show_default=True, help="The broker's.")
@broker_options(bind_default="127.0.0.1", dashboard_default=True)
@click.option("--api-host", default="127.0.0.1", show_default=True, help="The control plane's API.")
@click.option("--api-port", type=PORT, default=8080, show_default=True)
@click.option("--db", "db_url", help="SQLAlchemy URL (default: SQLite in DIRECTORY).")
@click.option("--force", is_flag=True, help="Write over what an earlier init left there.")
@os_failures
def init(directory: Path, mqtt_port: int, api_port: int, force: bool, **opts: Any) -> None:
    """Set up a fleet in DIRECTORY: the broker's config (broker/mosquitto.conf, with
    persistence), the control plane's (control-plane.toml, its state in control-plane/),
    its broker user, and the first operator token (printed once, kept in operator-token,
    mode 0600). Then prints the commands that start them."""
    from control_plane.provisioning.fleet_dir import FleetDir

    check_listener(opts["bind"], opts["tls"], opts["allow_plaintext"])
    cp_port = _control_plane_port(mqtt_port, opts["control_plane_port"])
    if opts["db_url"]:  # refused before anything is written
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(opts["db_url"])
        except ArgumentError as exc:
            raise click.BadParameter(str(exc), param_hint="--db") from exc
    fleet_dir = FleetDir(directory)
    if not force and (held := fleet_dir.existing()):
        raise click.ClickException(
            f"{directory} is not empty ({', '.join(held)}): pass --force to write over "
            "what is there, or choose another directory"
        )
    access = fleet_dir.access(opts["topic_prefix"])
    write_broker(
        access,
        fleet_dir.broker,
        port=mqtt_port,
        bind=opts["bind"],
        tls=opts["tls"],
        server_names=opts["server_names"],
        owner=opts["owner"],
        dashboard=opts["dashboard"],
        must_reach=True,
        control_plane_port=cp_port,
    )
    settings = fleet_dir.write_control_plane_config(
        access,
        mqtt_port=cp_port,
        bind=opts["bind"],
        tls=opts["tls"],
        server_names=opts["server_names"],
        api_host=opts["api_host"],
        api_port=api_port,
        db_url=opts["db_url"],
    )
    token = fleet_dir.first_tokens(str(settings["db_url"]))
    host = urlsplit(str(settings["mqtt_url"])).hostname or "127.0.0.1"
    dashboard = fleet_dir.dashboard_line(access, mqtt_port, tls=opts["tls"], host=host)
    summary = fleet_dir.summary(
        token, settings, tls=opts["tls"], device_port=mqtt_port, dashboard=dashboard
    )
    click.echo(summary)


fleet.add_command(add_device)
fleet.add_command(revoke_device)
fleet.add_command(dynsec_config)
fleet.add_command(mosquitto_config)
fleet.add_command(init)
