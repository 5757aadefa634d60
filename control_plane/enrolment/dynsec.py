"""Mosquitto's dynamic security plugin: the admin commands that add a device's user and ACL
while the broker runs (the broker's files: :mod:`control_plane.provisioning.dynsec_broker`).

Commands are JSON published to ``$CONTROL/dynamic-security/v1``, on the control plane's own
listener; the plugin answers each on ``$CONTROL/dynamic-security/v1/response``, echoing its
``correlationData``. NOTE: the command set is mosquitto 2.0's
(plugins/dynamic-security/README.md); the tests run them against the real plugin.

A device gets a role of its own naming its topics literally: the plugin's ACLs have no ``%u``
substitution that this could rely on. Its client is bound to the agent's client id, so no other
login resumes its session.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import uuid
from typing import Any
from urllib.parse import urlsplit

import aiomqtt

from common.protocol.topics import Topics
from control_plane.enrolment.batching import GroupCommit
from control_plane.enrolment.identity import AccountsLock
from control_plane.provisioning.acl import DEVICE_READS, DEVICE_WRITES
from control_plane.provisioning.dynsec_broker import CONTROL_TOPIC
from control_plane.provisioning.passwords import new_password
from control_plane.settings import ControlPlaneSettings

RESPONSE_TOPIC = f"{CONTROL_TOPIC}/response"
COMMAND_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_PER_COMMAND_S = 0.1
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


class DynsecAdmin:
    """Sends admin commands over a connection of its own (with the control plane's broker
    credentials), opened per message: devices enrolling at once share one. A device's
    commands (delete, create) run under ``lock``, which holds across replicas, so two replicas
    making one device's user do not interleave them."""

    def __init__(
        self,
        settings: ControlPlaneSettings,
        *,
        max_batch: int = 100,
        lock: AccountsLock | None = None,
    ) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.batches: GroupCommit[str] = GroupCommit(self._issue_batch, max_batch=max_batch)
        self._lock = lock or AccountsLock(settings.state_dir / "mqtt")
        self._wanted: dict[str, str] = {}

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

    async def issue(self, device_id: str, password: str | None = None) -> str:
        """Give ``device_id`` a user with ``password`` (None: a new one), replacing any it had,
        which ends its sessions, and its own ACL; return the password. Devices asking at once
        share one message (:class:`GroupCommit`)."""
        if password is not None:
            self._wanted[device_id] = password
        return await self.batches.submit(device_id)

    async def _issue_batch(self, device_ids: list[str]) -> dict[str, str | Exception]:
        # NOTE: the plugin (2.0.x) rewrites its whole file after every command that changes
        # it, so a device costs the broker two rewrites (its role with its ACLs inline, and
        # its client), not one per ACL as createRole + addRoleACL did
        passwords = {d: self._wanted.pop(d, "") or new_password() for d in device_ids}
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
        async with self._lock.held():
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
        async with self._lock.held():
            await self.run(
                [
                    {"command": "deleteClient", "username": device_id},
                    {"command": "deleteRole", "rolename": device_role(device_id)},
                ]
            )
