"""The fleet client's MQTT session (aiomqtt over paho-mqtt) and its message handling.

One long-lived task per concern, all under one TaskGroup: the MQTT session (reconnecting with
jittered exponential backoff, resubscribing, re-announcing itself), the updater, and the
telemetry timer. Telemetry and events go through the on-disk outbox, so nothing is lost while
the broker is away; they are drained in order once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import ssl
import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import ValidationError

from agent.accelerators import AcceleratorProbe
from agent.fleet.enrol import Enrolment, load_identity
from agent.fleet.outbox import Outbox
from agent.fleet.outcome import Report
from agent.fleet.settings import FleetSettings
from agent.fleet.shadow import ShadowStages, listed_shadows
from agent.fleet.stagers import GenerativeStager
from agent.fleet.state import StateFiles
from agent.fleet.store import ModelStore
from agent.fleet.telemetry import TelemetryCollector
from agent.fleet.updater import Item, Updater
from agent.inference.manager import ModelManager
from agent.inference.sketches import InputSketchBook
from agent.metrics import AgentMetrics
from common import __version__
from common.protocol.errors import ProtocolError, Rejection
from common.protocol.messages import (
    Command,
    DesiredState,
    DeviceStatus,
    ServedModel,
    Telemetry,
    TelemetryAck,
    UpdateEvent,
    UpdateState,
)
from common.protocol.signing import TrustRoot, apply_trust_update, parse_envelope
from common.protocol.topics import Topics
from common.protocol.verify import DeviceIdentity, claimed, verify_command, verify_manifest
from runtimes.errors import NoPlacementError
from runtimes.formats import GENAI_FORMAT, ModelFormat
from runtimes.hardware.context import HardwareContext

if TYPE_CHECKING:
    from agent.generative.models import GenerativeModels

log = logging.getLogger("edgefleet.agent.fleet")
T = TypeVar("T")
SESSION_EXPIRY_S = 24 * 3600
"""Broker-side session kept for an offline device, so QoS 1 commands wait for it."""
REMEMBERED_COMMANDS = 200
GOODBYE_TIMEOUT_S = 5.0
"""How long a shutdown waits for the broker to acknowledge the offline status. If it does not,
the clean DISCONNECT that follows makes the broker drop the will, and the device may stay
online in the inventory until it comes back: logged, not silent (a test waiting for a stopped
agent to show offline timed out once on a loaded machine, and was 2 s then)."""


def device_identity(settings: FleetSettings, hardware: HardwareContext) -> DeviceIdentity:
    formats = set()
    for fmt in ModelFormat:
        try:
            hardware.plan("probe", fmt)
        except NoPlacementError:
            continue
        formats.add(fmt.value)
    if ModelFormat.ONNX.value in formats:
        formats.add(GENAI_FORMAT)  # the token loop runs on ONNX Runtime where ONNX places
    return DeviceIdentity(
        settings.device_id, hardware.profile.name, dict(settings.labels), frozenset(formats)
    )


class FleetClient:
    trust: TrustRoot
    """What manifests and commands must be signed with (set once enrolled, on a first start
    by claim)."""

    def __init__(
        self,
        settings: FleetSettings,
        manager: ModelManager,
        hardware: HardwareContext,
        accelerators: AcceleratorProbe,
        metrics: AgentMetrics,
        sketches: InputSketchBook | None = None,
        generative: GenerativeStager | None = None,
    ) -> None:
        """``generative``: where generative versions go (None: this agent refuses them)."""
        self.settings = settings
        self.generative = generative
        self.manager = manager
        self.metrics = metrics
        self.topics = Topics(settings.topic_prefix)
        self.device_id = settings.device_id
        self.files = StateFiles(settings.state_dir)
        self.state = self.files.load_state()
        stored = load_identity(settings.state_dir, settings.device_id)
        self._username = stored.username if stored else settings.username
        self._password = stored.password if stored else settings.password
        self._enrolment: Enrolment | None = None
        if stored is None and settings.enrols:
            # the trust root comes with the identity (see run)
            self._enrolment = Enrolment(settings, self.files, hardware.profile.name)
        else:
            self.trust = self.files.load_trust(settings.trust_root_file)
        self.store = ModelStore(manager.repository)
        self.store.recover(
            {
                name: ms.committed_version
                for name, ms in self.state.models.items()
                if ms.committed_version is not None
            }
        )
        self._queued: set[tuple[str, int]] = set()
        """(model, sequence) of manifests submitted and not finished: redeliveries are ignored."""
        self._commands_queued: set[str] = set()
        """Ids of commands submitted and not run yet: recorded as executed only once they ran,
        so a crash before loses nothing (the redelivered command is run), and a duplicate
        delivered meanwhile is ignored."""
        self._last_desired: bytes | None = None
        self.outbox = Outbox(
            settings.state_dir / "outbox.sqlite3",
            max_bytes=settings.outbox_max_bytes,
            max_age_s=settings.outbox_max_age_s,
            resend_s=settings.telemetry_resend_s,
            resend_max_s=settings.telemetry_resend_max_s,
        )
        self.identity = device_identity(settings, hardware)
        self.shadows = ShadowStages(manager, self.store, hardware.profile.name)
        self.updater = Updater(
            manager,
            self.store,
            self.files,
            self.state,
            settings,
            self._report,
            self._status_changed,
            on_done=self._done,
            shadows=self.shadows,
            generative=generative,
        )
        self.telemetry = TelemetryCollector(
            manager,
            accelerators,
            sketches,
            generative=self._generative_models,
            hourly_cost=metrics.hourly_cost,
        )
        self.connected = asyncio.Event()
        self._wake = asyncio.Event()
        self._status_dirty = True

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        if self._enrolment is not None:
            try:
                identity = await self._enrolment.run()
            except BaseException:
                self.outbox.close()
                raise
            self._username, self._password = identity.username, identity.password
            self.trust = self.files.load_trust(self.settings.trust_root_file)
            self._enrolment = None
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.updater.run(), name="fleet:updater")
                tg.create_task(self._telemetry_loop(), name="fleet:telemetry")
                tg.create_task(self._session_loop(), name="fleet:session")
        finally:
            self.outbox.close()
            await self.shadows.close()

    async def _session_loop(self) -> None:
        delay = self.settings.reconnect_min_s
        while True:
            try:
                async with self._client() as client:
                    delay = self.settings.reconnect_min_s
                    await self._session(client)
            except aiomqtt.MqttError as exc:
                log.warning(
                    "broker connection lost",
                    extra={"error": str(exc), "retry_in_s": round(delay, 2)},
                )
            except Exception:
                # Anything else (a TLS file missing mid-rotation, a bug) ends this session, not
                # the fleet client: a device that stops trying is off the fleet until restarted.
                log.exception("fleet session failed", extra={"retry_in_s": round(delay, 2)})
            finally:
                self.connected.clear()
            # NOTE: jitter spreads a fleet's reconnects after a broker restart.
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(self.settings.reconnect_max_s, delay * 2)

    def _client(self) -> aiomqtt.Client:
        s = self.settings
        host, port, tls = s.broker()
        v5 = s.mqtt_protocol == "5"
        properties = None
        if v5:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = SESSION_EXPIRY_S
        will_properties = None
        if v5 and s.will_delay_s:
            will_properties = Properties(PacketTypes.WILLMESSAGE)  # type: ignore[no-untyped-call]
            will_properties.WillDelayInterval = s.will_delay_s
        will = aiomqtt.Will(
            self.topics.status(self.device_id),
            self._status(online=False),
            qos=1,
            retain=True,
            properties=will_properties,
        )
        return aiomqtt.Client(
            host,
            port,
            username=self._username,
            password=self._password.get_secret_value() if self._password else None,
            identifier=f"edgefleet-agent-{self.device_id}",
            protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
            will=will,
            keepalive=s.keepalive_s,
            tls_context=self._tls() if tls else None,
            clean_session=None if v5 else False,
            clean_start=False if v5 else 3,
            properties=properties,
            timeout=10,
        )

    def _tls(self) -> ssl.SSLContext:
        s = self.settings
        context = ssl.create_default_context(cafile=str(s.tls_ca_file) if s.tls_ca_file else None)
        if s.tls_cert_file and s.tls_key_file:
            context.load_cert_chain(str(s.tls_cert_file), str(s.tls_key_file))
        return context

    async def _session(self, client: aiomqtt.Client) -> None:
        topics = self.topics
        # The trust root first: its retained copy then arrives before the retained desired
        # state, so manifests signed by a newly announced key verify on the first pass.
        await uncancelled(client.subscribe(topics.trust, qos=1))
        await uncancelled(
            client.subscribe(
                [
                    (topics.desired(self.device_id), 1),
                    (topics.commands(self.device_id), 1),
                    (topics.acks(self.device_id), 1),
                ]
            )
        )
        self.outbox.reconnected()
        self._status_dirty = True
        self.connected.set()
        log.info("connected to the broker", extra={"device_id": self.device_id})
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._receive(client), name="fleet:receive")
                tg.create_task(self._drain(client), name="fleet:drain")
        except asyncio.CancelledError:
            # A clean shutdown says goodbye itself rather than leaving it to the will (the
            # broker drops the will on a clean DISCONNECT).
            try:
                await client.publish(
                    topics.status(self.device_id),
                    self._status(online=False),
                    qos=1,
                    retain=True,
                    timeout=GOODBYE_TIMEOUT_S,
                )
            except (aiomqtt.MqttError, TimeoutError) as exc:
                log.warning(
                    "offline status not acknowledged at shutdown",
                    extra={"device_id": self.device_id, "error": repr(exc)},
                )
            raise
        except ExceptionGroup as group:
            # surface a lost connection as itself, so the session loop reconnects
            lost = [e for e in group.exceptions if isinstance(e, aiomqtt.MqttError)]
            if lost:
                raise lost[0] from None
            raise

    def outbox_seq(self) -> int:
        """Number of the last telemetry message produced."""
        return self.outbox.last_seq("telemetry")

    def _generative_models(self) -> GenerativeModels | None:
        """The generative models, once there are any (None before: nothing to report)."""
        return self.generative.current if self.generative is not None else None

    # -- outgoing -------------------------------------------------------------------------

    def _status(self, *, online: bool) -> bytes:
        models = []
        if online:
            served = [(e.name, v) for e in self.manager.models.values() for v in e.served]
            generative = self._generative_models()
            if generative is not None:
                served += [(name, gv.version) for name, gv in sorted(generative.served.items())]
            for name, version in served:
                ms = self.state.models.get(name)
                seq = ms.committed_sequence if ms and ms.committed_version == version else None
                models.append(ServedModel(model=name, version=version, sequence=seq))
        status = DeviceStatus(
            device_id=self.device_id,
            online=online,
            agent_version=__version__,
            hardware_profile=self.identity.profile,
            labels=dict(self.settings.labels),
            models=models,
            sent_at=datetime.now(UTC),
            telemetry_interval_s=self.settings.telemetry_interval_s,
            trust_root_version=self.trust.version,
        )
        return status.model_dump_json(exclude_none=True).encode()

    def _status_changed(self) -> None:
        self._status_dirty = True
        self._wake.set()

    def _report(self, report: Report) -> None:
        event = UpdateEvent(
            device_id=self.device_id,
            event_id=uuid.uuid4().hex,
            time=datetime.now(UTC),
            model=report.model,
            version=report.version,
            sequence=report.sequence,
            rollout_id=report.rollout_id,
            state=report.state,
            code=report.code,
            reason=report.reason,
            progress=report.progress,
            bytes_done=report.bytes_done,
            bytes_total=report.bytes_total,
            window_s=report.window_s,
        )
        self.outbox.put(
            self.topics.events(self.device_id), event.model_dump_json().encode(), "event"
        )
        self._wake.set()

    async def _telemetry_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.telemetry_interval_s)
            try:
                self._telemetry_round()
            except Exception:
                # one round lost, not the telemetry for good (and with it the fleet client)
                log.exception("telemetry round failed")

    def _telemetry_round(self) -> None:
        window, models, device = self.telemetry.collect()
        models = self.shadows.annotate(models)
        body = Telemetry(
            device_id=self.device_id,
            seq=1,
            time=datetime.now(UTC),
            window_s=window,
            models=models,
            device=device,
            dropped=self.outbox.dropped("telemetry"),
        )

        def make(seq: int) -> bytes:
            return body.model_copy(update={"seq": seq}).model_dump_json().encode()

        self.outbox.put_numbered(self.topics.telemetry(self.device_id), make, "telemetry")
        self._wake.set()

    async def _drain(self, client: aiomqtt.Client) -> None:
        """Publish the status when it changed, then the outbox oldest first; a row leaves the
        outbox once the broker acknowledged it (an event) or the control plane stored it
        (telemetry, see :mod:`agent.fleet.outbox`)."""
        while True:
            self._wake.clear()
            if self._status_dirty:
                self._status_dirty = False
                await uncancelled(
                    client.publish(
                        self.topics.status(self.device_id),
                        self._status(online=True),
                        qos=1,
                        retain=True,
                        timeout=10,
                    )
                )
            batch = self.outbox.oldest(64)
            for item in batch:
                await uncancelled(client.publish(item.topic, item.payload, qos=1, timeout=10))
                self.outbox.published([item])
            if not batch and not self._status_dirty:
                # woken by new messages, or when a sent one is due again
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.outbox.next_due_s()):
                        await self._wake.wait()

    # -- incoming -------------------------------------------------------------------------

    async def _receive(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            topic = message.topic.value
            payload = (
                message.payload
                if isinstance(message.payload, bytes)
                else str(message.payload or "").encode()
            )
            leaf = topic.rsplit("/", 1)[-1]
            if not payload:
                continue  # a cleared retained message
            limit = self.settings.max_message_bytes
            try:
                if len(payload) > limit:
                    raise ProtocolError(
                        Rejection.OVERSIZE, f"{len(payload)} bytes exceed max_message_bytes {limit}"
                    )
                if topic == self.topics.desired(self.device_id):
                    self._on_desired(payload)
                elif topic == self.topics.commands(self.device_id):
                    self._on_command(payload)
                elif topic == self.topics.acks(self.device_id):
                    self._on_ack(payload)
                elif topic == self.topics.trust:
                    self._on_trust(payload)
                else:
                    raise ProtocolError(
                        Rejection.WRONG_TARGET, f"not a topic of this device: {topic}"
                    )
            except ProtocolError as exc:
                self._rejected(leaf, exc)
            except Exception:
                # The last line of defence: a message that trips a bug is dropped, counted and
                # logged with its traceback; the session and the updater keep running.
                log.exception("message handling failed", extra={"topic": leaf})
                self.metrics.fleet_rejected.labels(leaf, "internal_error").inc()

    def _rejected(self, leaf: str, exc: ProtocolError, *, report: bool = True) -> None:
        log.warning(
            "message rejected", extra={"topic": leaf, "code": exc.code.value, "reason": exc.message}
        )
        self.metrics.fleet_rejected.labels(leaf, exc.code.value).inc()
        if report:
            self._report(
                Report(
                    UpdateState.REJECTED,
                    exc.model or "",
                    None,
                    exc.sequence,
                    None,
                    exc.code.value,
                    exc.message,
                )
            )

    def _on_desired(self, payload: bytes) -> None:
        try:
            desired = DesiredState.model_validate_json(payload)
        except ValidationError as exc:
            code = (
                Rejection.UNSUPPORTED_SCHEMA
                if _schema_version(payload) not in (None, 1)
                else Rejection.MALFORMED
            )
            raise ProtocolError(code, f"desired state: {exc.errors()[0]['msg']}") from None
        if desired.device_id != self.device_id:
            raise ProtocolError(
                Rejection.WRONG_TARGET, f"desired state for device {desired.device_id}"
            )
        self._last_desired = payload
        now = datetime.now(UTC)
        # What it no longer lists was withdrawn (a rollout aborted or rolled back): dropped
        # unless already switched to, before anything it does list is queued.
        self.updater.withdraw({claimed(raw.get("signed")) for raw in desired.manifests})
        self.shadows.withdraw(*listed_shadows(desired.manifests))
        for raw in desired.manifests:
            try:
                vm = verify_manifest(raw, self.trust, self.identity, self._floor, now)
            except ProtocolError as exc:
                if exc.code == Rejection.REPLAYED and self._converged(exc.model, exc.sequence):
                    # the retained state we already applied (or already refused). Published
                    # again by a new leader or after a broker reset: the status saying so may
                    # have died with a replica that took it unstored, so it goes again (the
                    # rollout engine reads it back; events are not resent, issue 47)
                    self._status_changed()
                    continue
                self._rejected("desired", exc)
                continue
            except Exception as exc:
                # A bug that one manifest trips costs that manifest, not the other models' ones
                # in the same desired state.
                log.exception("manifest verification failed")
                model, sequence = claimed(raw.get("signed"))
                self._rejected(
                    "desired",
                    ProtocolError(
                        Rejection.MALFORMED,
                        f"manifest could not be verified: {type(exc).__name__}: {exc}",
                        model=model,
                        sequence=sequence,
                    ),
                )
                continue
            key = (vm.manifest.model, vm.manifest.sequence)
            if key in self._queued:
                continue  # redelivered while still being applied
            self._queued.add(key)
            self._report(
                Report(
                    UpdateState.RECEIVED,
                    vm.manifest.model,
                    vm.manifest.version,
                    vm.manifest.sequence,
                    vm.manifest.rollout_id,
                )
            )
            self.updater.submit(vm)
        if not self.updater.busy:
            self.updater.sweep_staging()  # after a restart: what the crash left and no one wants

    def _floor(self, model: str) -> int | None:
        ms = self.state.models.get(model)
        return ms.floor() if ms else None

    def _converged(self, model: str | None, sequence: int | None) -> bool:
        ms = self.state.models.get(model or "")
        return ms is not None and ms.applied(sequence)

    def _on_ack(self, payload: bytes) -> None:
        try:
            ack = TelemetryAck.model_validate_json(payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "message"
            raise ProtocolError(Rejection.MALFORMED, f"{where}: {first['msg']}") from None
        if ack.device_id != self.device_id:
            raise ProtocolError(Rejection.WRONG_TARGET, f"acknowledgement for {ack.device_id}")
        self.outbox.acknowledge_telemetry(ack.seqs)

    def _on_command(self, payload: bytes) -> None:
        command = verify_command(payload, self.trust, self.device_id, datetime.now(UTC))
        cid = command.command_id
        if cid in self.state.executed_commands or cid in self._commands_queued:
            return
        self._commands_queued.add(cid)
        log.info("command queued", extra={"command_id": cid, "model": command.model})
        self.updater.submit(command)

    def _done(self, item: Item) -> None:
        if isinstance(item, Command):
            # Recorded once it ran: running one twice is harmless (a rollback naming the version
            # it leaves finds it gone the second time), losing one is not.
            self._commands_queued.discard(item.command_id)
            self.state.executed_commands = [*self.state.executed_commands, item.command_id][
                -REMEMBERED_COMMANDS:
            ]
            self.files.save_state(self.state)
        else:
            self._queued.discard((item.manifest.model, item.manifest.sequence))

    def _on_trust(self, payload: bytes) -> None:
        envelope = parse_envelope(payload)
        if envelope.signed.get("version") == self.trust.version:
            return  # the retained copy of the root we hold
        self.trust = apply_trust_update(self.trust, envelope)
        self.files.save_trust(self.trust)
        self._status_changed()  # the fleet sees which root each device holds
        if self._last_desired is not None:  # what a key unknown until now signed may verify now
            self._on_desired(self._last_desired)
        log.info(
            "trust root updated",
            extra={
                "version": self.trust.version,
                "manifest_keys": [k.key_id for k in self.trust.manifest_keys],
                "revoked": self.trust.revoked,
            },
        )


def _schema_version(payload: bytes) -> object:
    try:
        doc = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None
    return doc.get("schema_version") if isinstance(doc, dict) else None


async def uncancelled(call: Awaitable[T]) -> T:
    """Await an aiomqtt call, and raise the cancellation it may have swallowed.

    aiomqtt waits through ``asyncio.wait_for``, which on Python 3.11 returns the call's result
    when the call completes in the same step as the task's cancellation, and drops the
    cancellation (NOTE: https://github.com/python/cpython/issues/86296, fixed in 3.12). The
    drain loop then went back to waiting for work, its session never ended, and a stopped agent
    neither stopped nor said goodbye (a test agent caught stuck in ``_drain`` by the fixture's
    60 s stop check, 2026-12-04). Its callers never catch a cancellation to carry on, so one
    requested of their task while the call ran is always meant to stop it."""
    task = asyncio.current_task()
    # counted from here: a task that lived through a TaskGroup's failure may carry an older count
    requested = task.cancelling() if task is not None else 0
    result = await call
    if task is not None and task.cancelling() > requested:
        raise asyncio.CancelledError
    return result
