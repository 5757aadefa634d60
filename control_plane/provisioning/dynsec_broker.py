"""A fleet broker whose device accounts are Mosquitto's dynamic security plugin's
(``edgefleet fleet dynsec-config``), written as a directory Mosquitto runs from:

    <out>/mosquitto.conf
    <out>/services.passwd, services.acl        the control plane's listener: its user alone
    <out>/data/dynamic-security.json           the plugin's file: the devices' users and roles,
                                               created by the control plane, rewritten by
                                               the broker after every change
    <out>/data/dynamic-security.first-load.json  empty (see below)

Two listeners (``per_listener_settings``). The devices' logs in through the plugin only; the
control plane's user is not one of the plugin's, so it is refused there (CONNACK 0x87). The
control plane's listener has its password file and ACL (as ``fleet init``'s broker) and the
plugin too, because Mosquitto 2.0 hands a ``$CONTROL/...`` message only to the plugins of the
listener it came in on (``control__process``, src/control.c); there the plugin defers for a
username it does not hold, and the password file and ACL decide.

NOTE: both listeners must share one set of accounts. Mosquitto 2.0.x loads the plugin's
library once: its state is process-wide and the file it saves to is the one named by the
listener initialised last (https://github.com/eclipse/mosquitto/issues/2423). The devices'
listener, first, names an empty file, so the accounts are loaded once, from the control
plane's listener's file; naming the same file twice would load every user twice and save
them twice. Should a Mosquitto give each listener an instance of its own, the devices' would
hold no account and refuse every device (closed, not open):
``tests/control_plane/enrolment/test_dynsec_broker.py`` checks the shared behaviour.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.files import write_atomically
from control_plane.provisioning.acl import CONTROL_PLANE_USER, render_acl
from control_plane.provisioning.mosquitto import (
    SERVICES_ACL,
    SERVICES_PASSWD,
    FleetAccess,
    broker_preamble,
)

CONTROL_TOPIC = "$CONTROL/dynamic-security/v1"
"""The plugin's admin topic (mosquitto 2.0, plugins/dynamic-security/README.md)."""
PLUGIN_FILE = "dynamic-security.json"
FIRST_LOAD_FILE = "dynamic-security.first-load.json"
PLUGIN_GLOBS = (
    "/usr/lib/*/mosquitto_dynamic_security.so",
    "/usr/lib/mosquitto_dynamic_security.so",
)
"""Where Debian's and Alpine's mosquitto packages put the plugin."""


def find_plugin() -> Path | None:
    """The plugin's library on this machine (``dpkg -L mosquitto | grep dynamic``), if any."""
    for pattern in PLUGIN_GLOBS:
        if found := sorted(glob.glob(pattern)):
            return Path(found[0])
    return None


def initial_config() -> dict[str, Any]:
    """The plugin's first file: no user (the control plane's is in ``services.passwd``), and
    nothing allowed that a role does not allow."""
    return {
        "clients": [],
        "roles": [],
        "defaultACLAccess": {
            "publishClientSend": False,
            "publishClientReceive": True,
            "subscribe": False,
            "unsubscribe": True,
        },
    }


@dataclass(frozen=True)
class DynsecBroker:
    conf: Path
    plugin_file: Path
    kept: bool
    """The plugin's file was there and is kept (with the users the broker made)."""
    holds_control_plane: bool
    """The kept file has a user named as the control plane's (written before its listener was
    apart), which would log in on the devices' listener: delete it (docs/enrolment.md)."""


def write_dynsec_broker(
    access: FleetAccess,
    out: Path,
    *,
    port: int,
    control_plane_port: int,
    bind: str,
    plugin: Path,
    owner: str | None = None,
    force: bool = False,
) -> DynsecBroker:
    """Write the broker's directory. An existing plugin file is kept unless ``force``.

    Raises:
        KeyError: no such ``owner``.
        PermissionError: handing files to ``owner`` needs root.
    """
    out = out.resolve()  # mosquitto resolves relative paths against its own cwd
    account = pwd.getpwnam(owner) if owner else None
    data = out / "data"
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    plugin_file, first_load = data / PLUGIN_FILE, data / FIRST_LOAD_FILE
    kept = plugin_file.exists() and not force
    if not kept:  # mode 0600 (mkstemp); the broker writes it anew in data/, mode 0700
        write_atomically(plugin_file, json.dumps(initial_config(), indent=1).encode())
    write_atomically(first_load, b"")
    access.service(CONTROL_PLANE_USER)
    services = access.passwords.only((CONTROL_PLANE_USER,), out / SERVICES_PASSWD)
    services.save()
    acl = render_acl(
        access.topics,
        control_plane_users=(CONTROL_PLANE_USER,),
        dashboard_users=(),
        patterns=False,
        control_plane_topics=(f"{CONTROL_TOPIC}/#",),
    )
    write_atomically(out / SERVICES_ACL, acl.encode())
    lines = [
        *broker_preamble(data, owner),
        "per_listener_settings true",
        "",
        "# devices: the plugin's users (created by the control plane), bound to their client ids",
        f"listener {port} {bind}",
        "allow_anonymous false",
        f"plugin {plugin}",
        "# empty: the accounts are loaded once, from the file named below (one plugin state",
        "# for both listeners in mosquitto 2.0; the file named last is the one it saves to)",
        f"plugin_opt_config_file {first_load}",
        "",
        "# the control plane: its user only (not the plugin's), any client id (one per replica)",
        f"listener {control_plane_port} {bind}",
        "allow_anonymous false",
        f"password_file {out / SERVICES_PASSWD}",
        f"acl_file {out / SERVICES_ACL}",
        "# for the plugin's admin topic, served only to clients of a listener that loads it",
        f"plugin {plugin}",
        f"plugin_opt_config_file {plugin_file}",
    ]
    conf = out / "mosquitto.conf"
    write_atomically(conf, ("\n".join(lines) + "\n").encode())
    if account is not None:
        for path in (data, *data.iterdir(), *out.iterdir()):
            os.chown(path, account.pw_uid, account.pw_gid)
    return DynsecBroker(conf, plugin_file, kept, kept and _holds_control_plane(plugin_file))


def _holds_control_plane(plugin_file: Path) -> bool:
    try:
        doc = json.loads(plugin_file.read_text())
    except (OSError, ValueError):
        return False
    clients = doc.get("clients", []) if isinstance(doc, dict) else []
    return any(isinstance(c, dict) and c.get("username") == CONTROL_PLANE_USER for c in clients)
