"""``edgefleet fleet``: broker credentials for a fleet, kept in the control plane's state
directory (``--state-dir``, or ``EDGEFLEET_CP_STATE_DIR``)."""

from __future__ import annotations

from pathlib import Path

import click

STATE_DIR = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="EDGEFLEET_CP_STATE_DIR",
    default=Path("var/control-plane"),
    show_default=True,
    help="The control plane's state directory (credentials live under mqtt/ and pki/).",
)


def register_fleet(root: click.Group) -> None:
    @root.group("fleet")
    def fleet() -> None:
        """Broker access: device credentials, certificates, Mosquitto password file and ACL."""

    @fleet.command("add-device")
    @click.argument("device_id")
    @click.option(
        "--cert-out",
        type=click.Path(file_okay=False, path_type=Path),
        help="Also issue a client certificate (CN = device id) and write it, its key and the "
        "CA certificate here, for a broker that requires mutual TLS.",
    )
    @STATE_DIR
    def add_device(device_id: str, cert_out: Path | None, state_dir: Path) -> None:
        """Issue DEVICE_ID's broker password (printed once; only its hash is kept)."""
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
        click.echo(password)

    @fleet.command("revoke-device")
    @click.argument("device_id")
    @STATE_DIR
    def revoke_device(device_id: str, state_dir: Path) -> None:
        """Remove DEVICE_ID's password and revoke its certificates; then rewrite the broker's
        config (mosquitto-config) and reload the broker."""
        from control_plane.provisioning.mosquitto import FleetAccess

        removed, certs = FleetAccess(state_dir).revoke_device(device_id)
        if not removed and not certs:
            raise click.ClickException(f"no credentials for device {device_id}")
        click.echo(
            f"{device_id}: password {'removed' if removed else 'none'}, "
            f"{certs} certificate(s) revoked"
        )

    @fleet.command("mosquitto-config")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
    @click.option("--port", type=int, default=1883, show_default=True)
    @click.option("--bind", default="0.0.0.0", show_default=True)
    @click.option("--tls", is_flag=True, help="Mutual TLS: clients authenticate by certificate.")
    @click.option(
        "--allow-plaintext",
        is_flag=True,
        help="Without --tls, listen beyond loopback anyway: device passwords and model "
        "manifests then cross the network unencrypted.",
    )
    @click.option(
        "--server-name",
        "server_names",
        multiple=True,
        default=("localhost", "127.0.0.1"),
        show_default=True,
        help="DNS name or IP address of the broker, for its certificate (repeatable).",
    )
    @click.option("--topic-prefix", default="edgefleet", show_default=True)
    @click.option(
        "--owner",
        help="The user the broker runs as (its `user` setting, e.g. mosquitto): the files are "
        "handed to it, since Mosquitto reads them after dropping root.",
    )
    @click.option(
        "--dashboard", is_flag=True, help="Also a read-only user for dashboards (device reports)."
    )
    @STATE_DIR
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
        from control_plane.provisioning.acl import CONTROL_PLANE_USER, DASHBOARD_USER
        from control_plane.provisioning.mosquitto import FleetAccess, loopback_only

        if not tls and not allow_plaintext and not loopback_only(bind):
            # Security by default: a fleet's broker reached over the network carries device
            # passwords in every CONNECT; in clear they are anyone's on the path.
            raise click.UsageError(
                f"--bind {bind} without --tls would send device passwords unencrypted over the "
                "network: add --tls (mutual TLS), --bind 127.0.0.1 for a broker only this "
                "machine reaches, or --allow-plaintext if the network is trusted"
            )

        access = FleetAccess(state_dir, Topics(topic_prefix))
        if dashboard:
            reader = access.service(DASHBOARD_USER, tls=tls)
            click.echo(f"dashboard: username {reader.user!r}, password in {reader.password_file}")
        try:
            conf = access.write_config(
                out, port=port, bind=bind, tls=tls, server_names=server_names, owner=owner
            )
        except (KeyError, PermissionError) as exc:  # no such user; chown needs root
            raise click.ClickException(f"--owner {owner}: {exc}") from exc
        service = access.service(CONTROL_PLANE_USER, tls=tls)
        click.echo(f"wrote {conf}")
        click.echo(
            f"control plane: mqtt_username = {service.user!r}, password in {service.password_file}"
        )
        if service.cert is not None:
            click.echo(
                f"control plane: mqtt_tls_cert_file = {service.cert}, "
                f"mqtt_tls_key_file = {service.key}"
            )

    del fleet, add_device, revoke_device, mosquitto_config
