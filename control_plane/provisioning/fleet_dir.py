"""The directory ``edgefleet fleet init`` sets a fleet up in::

DIR/broker/                  mosquitto.conf, acl, passwd (or the TLS files); data/: persistence
DIR/control-plane.toml       the control plane's settings (no secret in it)
DIR/control-plane/           its state: broker credentials (mqtt/, pki/), database, keys,
                             artifacts, admin-token, trust-root.json (at its first start)
DIR/operator-token           the first operator API token (mode 0600)
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import tomli_w

from common.files import write_atomically
from common.protocol.topics import Topics
from control_plane.provisioning.acl import CONTROL_PLANE_USER, DASHBOARD_USER
from control_plane.provisioning.mosquitto import FleetAccess

WILDCARDS = frozenset({"0.0.0.0", "::", ""})


class FleetDir:
    def __init__(self, directory: Path) -> None:
        self.shown = directory  # as the operator typed it, for the commands printed
        self.root = directory.resolve()
        self.broker = self.root / "broker"
        self.state_dir = self.root / "control-plane"
        self.config = self.root / "control-plane.toml"
        self.token_file = self.root / "operator-token"

    def existing(self) -> list[str]:
        """What is in the directory already (a few names), empty if nothing."""
        if not self.root.is_dir():
            return []
        names = sorted(p.name for p in self.root.iterdir())
        return names[:4] + (["..."] if len(names) > 4 else [])

    def access(self, topic_prefix: str) -> FleetAccess:
        return FleetAccess(self.state_dir, Topics(topic_prefix))

    def write_control_plane_config(
        self,
        access: FleetAccess,
        *,
        mqtt_port: int,
        bind: str,
        tls: bool,
        server_names: tuple[str, ...],
        api_host: str,
        api_port: int,
        db_url: str | None,
    ) -> dict[str, object]:
        """Write control-plane.toml (absolute paths, so it runs from any directory; the broker
        password by file only) and return its settings. ``mqtt_port``: the broker's control
        plane listener."""
        service = access.service(CONTROL_PLANE_USER, tls=tls)
        host = "127.0.0.1" if bind in WILDCARDS else bind
        if tls and server_names and host not in server_names:
            host = server_names[0]  # the name the broker's certificate is checked against
        settings: dict[str, object] = {
            "db_url": db_url or f"sqlite+aiosqlite:///{self.state_dir / 'edgefleet.db'}",
            "mqtt_url": f"{'mqtts' if tls else 'mqtt'}://{_url_host(host)}:{mqtt_port}",
            "host": api_host,
            "port": api_port,
            "state_dir": str(self.state_dir),
            "artifact_dir": str(self.state_dir / "artifacts"),
            "topic_prefix": access.topics.prefix,
        }
        settings |= {
            "mqtt_username": service.user,
            "mqtt_password_file": str(service.password_file),
        }
        if tls:  # its listener takes a fleet certificate and the control plane's password
            settings |= {
                "mqtt_tls_ca_file": str(access.ca.cert_path),
                "mqtt_tls_cert_file": str(service.cert),
                "mqtt_tls_key_file": str(service.key),
            }
        text = "# Written by `edgefleet fleet init`.\n" + tomli_w.dumps(settings)
        write_atomically(self.config, text.encode())
        self.config.chmod(0o644)  # no secret in it: the control plane may run as another user
        return settings

    def first_tokens(self, db_url: str) -> str:
        """Create the database, the admin token the control plane's first start would create
        (control-plane/admin-token), and an operator token, kept in operator-token (mode 0600)
        and returned."""
        from control_plane.db.session import make_engine, migrate, session_factory
        from control_plane.tokens import Role, bootstrap_admin, create_token

        migrate(db_url)

        async def make() -> str:
            engine = make_engine(db_url)
            try:
                sessions = session_factory(engine)
                await bootstrap_admin(sessions, self.state_dir / "admin-token")
                async with sessions.begin() as s:
                    return await create_token(s, "operator", Role.OPERATOR)
            finally:
                await engine.dispose()

        token = asyncio.run(make())
        write_atomically(self.token_file, (token + "\n").encode())  # mode 0600 (mkstemp)
        return token

    def dashboard_line(
        self, access: FleetAccess, port: int, *, tls: bool, host: str = "127.0.0.1"
    ) -> str | None:
        """The ``mosquitto_sub`` command that follows the fleet's telemetry as the read-only
        dashboard user (None: there is none). It logs in on the devices' listener, so its
        client id is its username: it can take over no control plane's session."""
        if DASHBOARD_USER not in access.passwords.entries:
            return None
        mqtt = self.shown / "control-plane" / "mqtt"
        topic = access.topics.all_devices("telemetry")
        if tls:  # the certificate's name is the username
            login = (
                f"--cafile {mqtt.parent / 'pki' / 'ca.pem'} --cert {mqtt / DASHBOARD_USER}.pem "
                f"--key {mqtt / DASHBOARD_USER}.key"
            )
        else:
            login = f'-u {DASHBOARD_USER} -P "$(cat {mqtt / DASHBOARD_USER}.password)"'
        return f"mosquitto_sub -h {host} -p {port} {login} -t '{topic}' -v"

    def summary(
        self,
        token: str,
        settings: dict[str, object],
        *,
        tls: bool,
        device_port: int,
        dashboard: str | None = None,
    ) -> str:
        """What was written, the token (this once), and the commands to run next."""
        d = self.shown
        url = urlsplit(str(settings["mqtt_url"]))
        device_url = f"{url.scheme}://{_url_host(url.hostname or '127.0.0.1')}:{device_port}"
        api = f"http://{_url_host(str(settings['host']))}:{settings['port']}"
        mosquitto = "mosquitto" if shutil.which("mosquitto") else "/usr/sbin/mosquitto"
        add = f"edgefleet fleet add-device DEVICE --state-dir {d / 'control-plane'}"
        if tls:  # the certificate is the login: no password
            add += " --cert-out DEVICE"
            agent_env = ""
            credentials = [
                'tls_ca_file = "DEVICE/ca.pem"',
                'tls_cert_file = "DEVICE/DEVICE.pem"',
                'tls_key_file = "DEVICE/DEVICE.key"',
            ]
        else:
            add += " > DEVICE.password"
            agent_env = 'EDGEFLEET_AGENT_FLEET__PASSWORD="$(cat DEVICE.password)" '
            credentials = ['username = "DEVICE"']
        lines = [
            f"wrote {d / 'broker' / 'mosquitto.conf'} and {d / 'control-plane.toml'}",
            f"operator token, shown only now (kept in {d / 'operator-token'}, mode 0600):",
            f"  {token}",
            f"admin token (tokens, keys): {d / 'control-plane' / 'admin-token'}",
            "",
            "next:",
            f"  {mosquitto} -c {d / 'broker' / 'mosquitto.conf'} &",
            f"  edgefleet control-plane --config {d / 'control-plane.toml'} &",
            f"  {add}",
            f'  kill -HUP "$(cat {d / "broker" / "data" / "mosquitto.pid"})"'
            "   # the broker rereads its files",
            f"  {agent_env}edgefleet agent --config agent.toml &",
            "    agent.toml:",
            "      [fleet]",
            f'      mqtt_url = "{device_url}"',
            '      device_id = "DEVICE"',
            *(f"      {line}" for line in credentials),
            f'      trust_root_file = "{self.state_dir / "trust-root.json"}"',
            f'  export EDGEFLEET_URL={api} EDGEFLEET_TOKEN="$(cat {d / "operator-token"})"',
            *([f"dashboard (read-only): {dashboard}"] if dashboard else []),
            "see docs/quickstart-fleet.md",
        ]
        if not shutil.which(mosquitto):
            lines.append("no mosquitto here: apt-get install mosquitto (Debian, Ubuntu)")
        return "\n".join(lines)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
