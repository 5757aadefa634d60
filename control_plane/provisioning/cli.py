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


def broker_options(bind_default: str) -> Callable[[F], F]:
    """The options of the broker's config, shared by ``mosquitto-config`` and ``init``."""
    options = [
        click.option("--bind", default=bind_default, show_default=True),
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
            "--dashboard",
            is_flag=True,
            help="Also a read-only user for dashboards (device reports).",
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
            out, port=port, bind=bind, tls=tls, server_names=server_names, owner=owner
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


def register_fleet(root: click.Group) -> None:
    @root.group("fleet")
    def fleet() -> None:
        """A fleet's broker and control plane (init); device credentials, certificates,
        Mosquitto password file and ACL."""

    @fleet.command("add-device")
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
        from control_plane.provisioning.mosquitto import FleetAccess

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

    @fleet.command("revoke-device")
    @click.argument("device_id")
    @click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
    @STATE_DIR
    @os_failures
    def revoke_device(device_id: str, as_json: bool, state_dir: Path) -> None:
        """Remove DEVICE_ID's password and revoke its certificates, in the broker's files too
        (where `init` or `mosquitto-config` wrote them); then reload the broker."""
        from control_plane.provisioning.mosquitto import FleetAccess

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
            f"{device_id}: password {'removed' if removed else 'none'}, "
            f"{certs} certificate(s) revoked"
        )

    @fleet.command("dynsec-config")
    @click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
    @click.option("--topic-prefix", default="edgefleet", show_default=True)
    @click.option(
        "--force",
        is_flag=True,
        help="Replace an existing file, and every user the broker kept in it.",
    )
    @STATE_DIR
    @os_failures
    def dynsec_config(out: Path, topic_prefix: str, force: bool, state_dir: Path) -> None:
        """Write the first file of Mosquitto's dynamic security plugin: the control plane's
        broker user (its password kept in the state directory), which administers the plugin
        and so creates the users of devices enrolled by claim (docs/enrolment.md)."""
        if out.exists() and not force:
            # the broker keeps enrolled devices' users in this file: replacing it locks them out
            raise click.ClickException(
                f"{out} exists (the broker keeps enrolled devices' users in it); "
                "--force replaces it"
            )
        from common.files import write_atomically
        from common.protocol.topics import Topics
        from control_plane.enrolment.dynsec import initial_config
        from control_plane.provisioning.acl import CONTROL_PLANE_USER
        from control_plane.provisioning.mosquitto import FleetAccess

        access = FleetAccess(state_dir, Topics(topic_prefix))
        service = access.service(CONTROL_PLANE_USER)
        doc = initial_config(access.topics, service.password_file.read_text())
        write_atomically(out, json.dumps(doc, indent=1).encode())  # mode 0600: hashes
        click.echo(f"wrote {out}")
        click.echo(
            f"mosquitto.conf: plugin_opt_config_file {out.resolve()} and plugin "
            "<the mosquitto_dynamic_security.so of `dpkg -L mosquitto`>; control plane: "
            f"mqtt_username = {service.user!r}, mqtt_password_file = {service.password_file}, "
            'enrolment.accounts = "dynsec"'
        )

    @fleet.command("mosquitto-config")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
    @click.option("--port", type=PORT, default=1883, show_default=True)
    @broker_options(bind_default="0.0.0.0")
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
        state_dir: Path,
    ) -> None:
        """Write mosquitto.conf, the ACL and the password file (or, with --tls, the CA, the
        broker certificate and the CRL) for every device issued so far."""
        from common.protocol.topics import Topics
        from control_plane.provisioning.acl import CONTROL_PLANE_USER
        from control_plane.provisioning.mosquitto import FleetAccess

        check_listener(bind, tls, allow_plaintext)
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
        )
        service = access.service(CONTROL_PLANE_USER, tls=tls)
        click.echo(f"wrote {conf}")
        click.echo(
            f"control plane: mqtt_username = {service.user!r}, "
            f"mqtt_password_file = {service.password_file}"
        )
        if service.cert is not None:
            click.echo(
                f"control plane: mqtt_tls_cert_file = {service.cert}, "
                f"mqtt_tls_key_file = {service.key}"
            )

    @fleet.command("init")
    @click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
    @click.option("--mqtt-port", type=PORT, default=1883, show_default=True, help="The broker's.")
    @broker_options(bind_default="127.0.0.1")
    @click.option(
        "--api-host", default="127.0.0.1", show_default=True, help="The control plane's API."
    )
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
        )
        settings = fleet_dir.write_control_plane_config(
            access,
            mqtt_port=mqtt_port,
            bind=opts["bind"],
            tls=opts["tls"],
            server_names=opts["server_names"],
            api_host=opts["api_host"],
            api_port=api_port,
            db_url=opts["db_url"],
        )
        token = fleet_dir.first_tokens(str(settings["db_url"]))
        click.echo(fleet_dir.summary(token, settings, tls=opts["tls"]))

    del fleet, add_device, revoke_device, dynsec_config, mosquitto_config, init
