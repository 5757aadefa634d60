"""Mosquitto's dynamic security plugin: the fleet's initial configuration file, and the admin
commands that add a device's user and ACL while the broker runs.

Commands are JSON published to ``$CONTROL/dynamic-security/v1``; the plugin answers each on
``$CONTROL/dynamic-security/v1/response``, echoing its ``correlationData``. NOTE: the command
set and the file format are mosquitto 2.0's (plugins/dynamic-security/README.md); the tests
run them against the real plugin. The file stores PBKDF2-SHA512 hashes, as the password file
does (:mod:`control_plane.provisioning.passwords`).

A device gets a role of its own naming its topics literally: the plugin's ACLs have no ``%u``
substitution that this could rely on. Its client is bound to the agent's client id, so no other
login resumes its session.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import ssl
import uuid
from typing import Any
from urllib.parse import urlsplit

import aiomqtt

from common.protocol.topics import Topics
from control_plane.enrolment.batching import GroupCommit
from control_plane.provisioning.acl import CONTROL_PLANE_USER, DEVICE_READS, DEVICE_WRITES
from control_plane.provisioning.passwords import ITERATIONS, SALT_BYTES, new_password
from control_plane.settings import ControlPlaneSettings

CONTROL_TOPIC = "$CONTROL/dynamic-security/v1"
RESPONSE_TOPIC = f"{CONTROL_TOPIC}/response"
COMMAND_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_PER_COMMAND_S = 0.1
CONTROL_PLANE_ROLE = "edgefleet-control-plane"
AGENT_CLIENT_ID = "edgefleet-agent-{}"
"""The client id the agent connects with (agent/fleet/client.py)."""


class DynsecError(Exception):
    """The plugin refused a command, or did not answer in time."""


def device_role(device_id: str) -> str:
    return f"edgefleet-device-{device_id}"


def device_acls(topics: Topics, device_id: str) -> list[dict[str, Any]]:
    """A device's own subtree: publish its reports, subscribe to what is sent to it."""
    acls = [
        {"acltype": "publishClientSend", "topic": topics.device(device_id, leaf), "allow": True}
        for leaf in DEVICE_WRITES
    ]
    reads = [topics.device(device_id, leaf) for leaf in DEVICE_READS] + [topics.trust]
    acls += [{"acltype": "subscribeLiteral", "topic": t, "allow": True} for t in reads]
    return acls


def control_plane_acls(topics: Topics) -> list[dict[str, Any]]:
    """As the ACL file's control plane user (:func:`control_plane.provisioning.acl.render_acl`),
    plus the plugin's admin topics."""
    acls: list[dict[str, Any]] = []
    for leaf in DEVICE_WRITES:
        acls.append({"acltype": "subscribePattern", "topic": topics.all_devices(leaf)})
    for leaf in DEVICE_READS:
        acls.append({"acltype": "publishClientSend", "topic": topics.all_devices(leaf)})
    acls += [
        {"acltype": "publishClientSend", "topic": topics.trust},
        {"acltype": "subscribePattern", "topic": topics.trust},
        {"acltype": "publishClientSend", "topic": f"{CONTROL_TOPIC}/#"},
        {"acltype": "subscribePattern", "topic": f"{CONTROL_TOPIC}/#"},
        # NOTE: the plugin's answers are not delivered under the default receive access; its
        # own admin role (mosquitto_ctrl dynsec init) allows them by name too
        {"acltype": "publishClientReceive", "topic": f"{CONTROL_TOPIC}/#"},
    ]
    return [{**acl, "allow": True} for acl in acls]


def _hashed(password: str) -> dict[str, Any]:
    salt = os.urandom(SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, ITERATIONS)
    return {
        "password": base64.b64encode(digest).decode(),
        "salt": base64.b64encode(salt).decode(),
        "iterations": ITERATIONS,
    }


def initial_config(topics: Topics, control_plane_password: str) -> dict[str, Any]:
    """The plugin's file (``plugin_opt_config_file``) for a new fleet: the control plane's user,
    which administers the plugin, and nothing else allowed by default."""
    return {
        "clients": [
            {
                "username": CONTROL_PLANE_USER,
                "textName": "edgefleet control plane",
                **_hashed(control_plane_password),
                "roles": [{"rolename": CONTROL_PLANE_ROLE}],
            }
        ],
        "roles": [{"rolename": CONTROL_PLANE_ROLE, "acls": control_plane_acls(topics)}],
        "defaultACLAccess": {
            "publishClientSend": False,
            "publishClientReceive": True,
            "subscribe": False,
            "unsubscribe": True,
        },
    }


class DynsecAdmin:
    """Sends admin commands over a connection of its own (with the control plane's broker
    credentials), opened per message: devices enrolling at once share one."""

    def __init__(self, settings: ControlPlaneSettings, *, max_batch: int = 100) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.batches: GroupCommit[str] = GroupCommit(self._issue_batch, max_batch=max_batch)

    def _client(self) -> aiomqtt.Client:
        s = self.settings
        parts = urlsplit(s.mqtt_url)
        tls = parts.scheme == "mqtts"
        context = None
        if tls:
            context = ssl.create_default_context(
                cafile=str(s.mqtt_tls_ca_file) if s.mqtt_tls_ca_file else None
            )
            if s.mqtt_tls_cert_file and s.mqtt_tls_key_file:
                context.load_cert_chain(str(s.mqtt_tls_cert_file), str(s.mqtt_tls_key_file))
        return aiomqtt.Client(
            parts.hostname or "127.0.0.1",
            parts.port or (8883 if tls else 1883),
            username=s.mqtt_username,
            password=s.mqtt_password.get_secret_value() if s.mqtt_password else None,
            identifier=f"{s.mqtt_client_id[:40]}-dynsec-{uuid.uuid4().hex[:8]}",
            protocol=aiomqtt.ProtocolVersion.V5,
            tls_context=context,
            timeout=COMMAND_TIMEOUT_S,
        )

    async def run(self, commands: list[dict[str, Any]]) -> list[str | None]:
        """Send ``commands`` in one message; return each one's error (None: done).

        Raises:
            DynsecError: no answer within COMMAND_TIMEOUT_S, or the broker refused the
                connection or the admin topics.
        """
        ids = [uuid.uuid4().hex for _ in commands]
        tagged = [{**c, "correlationData": i} for c, i in zip(commands, ids, strict=True)]
        body = {"commands": tagged}
        errors: dict[str, str | None] = {}
        # each command may rewrite the plugin's whole file: a long batch takes longer
        timeout_s = COMMAND_TIMEOUT_S + COMMAND_TIMEOUT_PER_COMMAND_S * len(commands)
        try:
            async with asyncio.timeout(timeout_s), self._client() as client:
                await client.subscribe(RESPONSE_TOPIC, qos=1)
                await client.publish(CONTROL_TOPIC, json.dumps(body).encode(), qos=1)
                async for message in client.messages:
                    for answer in json.loads(message.payload).get("responses", []):
                        if answer.get("correlationData") in ids:
                            errors[answer["correlationData"]] = answer.get("error")
                    if len(errors) == len(ids):
                        break
        except TimeoutError:
            raise DynsecError(
                f"the broker's dynamic security plugin did not answer within {timeout_s:.0f} s"
                " (is it loaded, and may the control plane's user use $CONTROL?)"
            ) from None
        except aiomqtt.MqttError as exc:
            raise DynsecError(f"broker: {exc}") from exc
        return [errors.get(i) for i in ids]

    async def issue(self, device_id: str) -> str:
        """Give ``device_id`` a user with a new password (replacing any it had, which ends its
        sessions) and its own ACL; return the password. Devices asking at once share one
        message (:class:`GroupCommit`)."""
        return await self.batches.submit(device_id)

    async def _issue_batch(self, device_ids: list[str]) -> dict[str, str | Exception]:
        # NOTE: the plugin (2.0.x) rewrites its whole file after every command that changes
        # it, so a device costs the broker two rewrites (its role with its ACLs inline, and
        # its client), not one per ACL as createRole + addRoleACL did
        passwords = {d: new_password() for d in device_ids}
        commands: list[dict[str, Any]] = []
        for device_id, password in passwords.items():
            role = device_role(device_id)
            commands += [
                {"command": "deleteClient", "username": device_id},
                {
                    "command": "createRole",
                    "rolename": role,
                    "acls": device_acls(self.topics, device_id),
                },
                {
                    "command": "createClient",
                    "username": device_id,
                    "password": password,
                    "clientid": AGENT_CLIENT_ID.format(device_id),
                    "roles": [{"rolename": role}],
                },
            ]
        errors = await self.run(commands)
        results: dict[str, str | Exception] = {}
        for k, (device_id, password) in enumerate(passwords.items()):
            error = errors[3 * k + 2]  # its createClient's
            results[device_id] = (
                password if error is None else DynsecError(f"createClient {device_id}: {error}")
            )
        return results

    async def remove(self, device_id: str) -> None:
        """Delete the device's user (its sessions end) and its role."""
        await self.run(
            [
                {"command": "deleteClient", "username": device_id},
                {"command": "deleteRole", "rolename": device_role(device_id)},
            ]
        )
