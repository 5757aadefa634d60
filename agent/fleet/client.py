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
import time
import uuid
from collections import deque
from collections.abc import Awaitable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import ValidationError

from agent.accelerators import AcceleratorProbe
from agent.fleet.agent_release import AGENT_KEY, AgentReleases, is_agent_release
from agent.fleet.bundles import BundleInbox, BundleResult, accepted, refused
from agent.fleet.capture_upload import CaptureUploader
from agent.fleet.diagnostics import (
    BundleSources,
    DiagnosticUploader,
    fitted_bundle,
    is_diagnostic,
    log_file,
    read_logs,
    redacted,
    scrub,
    secret_values,
)
from agent.fleet.enrol import Enrolment, load_identity
from agent.fleet.ground_truth import OutcomeJournal, attach
from agent.fleet.outbox import Outbox
from agent.fleet.outcome import Report
from agent.fleet.settings import FleetSettings
from agent.fleet.shadow import ShadowStages, listed_shadows
from agent.fleet.stagers import GenerativeStager
from agent.fleet.state import StateFiles
from agent.fleet.store import ModelStore
from agent.fleet.telemetry import TelemetryCollector
from agent.fleet.twin import TwinKeeper
from agent.fleet.updater import Item, Updater
from agent.inference.capture import CaptureTap, ModelCounts
from agent.inference.manager import ModelManager
from agent.inference.predictions import PredictionStore
from agent.inference.sketches import InputSketchBook
from agent.launcher.report import LauncherView
from agent.metrics import AgentMetrics
from common import __version__
from common.model_config import CaptureConfig
from common.protocol.agent_release import AgentReleaseManifest
from common.protocol.bundle import BundleReader
from common.protocol.capture import CaptureAck, FleetAck
from common.protocol.diagnostics import DEFAULT_LOG_BYTES, MAX_DIAGNOSTIC_BYTES, DiagnosticAck
from common.protocol.errors import ProtocolError, Rejection
from common.protocol.messages import (
    CaptureStatus,
    Command,
    CommandType,
    DesiredState,
    DeviceStatus,
    ServedModel,
    Telemetry,
    UpdateEvent,
    UpdateState,
)
from common.protocol.signing import TrustRoot, apply_trust_update, parse_envelope
from common.protocol.topics import Topics
from common.protocol.twin import TWIN_KEY, is_twin, verify_twin
from common.protocol.verify import (
    DeviceIdentity,
    VerifiedManifest,
    claimed,
    verify_command,
    verify_manifest,
)
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
RECENT_EVENTS = 50
"""Update events a support bundle shows, the newest (kept in memory since the start)."""
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
        predictions: PredictionStore | None = None,
        capture: CaptureTap | None = None,
        twin: TwinKeeper | None = None,
        bundle: BundleSources | None = None,
    ) -> None:
        """``generative``: where generative versions go (None: this agent refuses them);
        ``predictions``, ``capture``, ``bundle``: see :meth:`_journals`; ``twin``: see twin.py."""
        self.settings = settings
        self.generative = generative
        self.manager, self.metrics = manager, metrics
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
        self.store = self._recovered_store(manager)
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
        self.outcomes, self.capture, self.diagnostics = self._journals(predictions, capture, bundle)
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
        self.launcher = LauncherView(settings.launcher_journal_file)
        self.bundles = BundleInbox(settings, self.store.staging)
        self.agent_releases = AgentReleases(settings, self.identity, self._trust, self._report)
        self.twin = twin or TwinKeeper.of_fleet(settings)
        self.connected, self._wake = asyncio.Event(), asyncio.Event()
        self._status_dirty = True

    def _recovered_store(self, manager: ModelManager) -> ModelStore:
        """The model store, with what an interrupted switch left behind put right."""
        store = ModelStore(manager.repository)
        versions = {name: ms.committed_version for name, ms in self.state.models.items()}
        store.recover({name: v for name, v in versions.items() if v is not None})
        return store

    def _journals(
        self,
        predictions: PredictionStore | None,
        capture: CaptureTap | None,
        bundle: BundleSources | None,
    ) -> tuple[OutcomeJournal, CaptureUploader | None, DiagnosticUploader]:
        """What waits on disk beside the outbox: the outcomes joined with ``predictions``
        (their journal), ``capture``'s spooled samples (their uploader), and the log lines
        (the uploader of answers to log and bundle requests: ``bundle`` says what settings a
        bundle shows and what secrets no answer may carry; default the fleet settings')."""
        s = self.settings
        outcomes = OutcomeJournal(s.state_dir / "ground_truth.sqlite3")
        if predictions is not None:
            predictions.sink = outcomes.add
        bundle = bundle or BundleSources(redacted(s), ())
        self._config, self._secrets = bundle.config, (*bundle.secrets, *secret_values(s))
        self._events: deque[UpdateEvent] = deque(maxlen=RECENT_EVENTS)
        diagnostics = DiagnosticUploader(s.device_id, s.telemetry_resend_s, self._diagnostic_answer)
        return outcomes, CaptureUploader(capture, s.device_id, s) if capture else None, diagnostics

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
        if self.capture is not None:
            loop, wake = asyncio.get_running_loop(), self.capture.wake

            def stored() -> None:  # from the capture writer's thread
                loop.call_soon_threadsafe(wake.set)

            self.capture.tap.on_stored = stored
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.updater.run(), name="fleet:updater")
                tg.create_task(self.agent_releases.run(), name="fleet:agent-releases")
                tg.create_task(self._telemetry_loop(), name="fleet:telemetry")
                tg.create_task(self._session_loop(), name="fleet:session")
                tg.create_task(self._bundle_loop(), name="fleet:bundles")
        finally:
            self.outbox.close()
            self.outcomes.close()
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
        self.diagnostics.reconnected()
        if self.capture is not None:
            self.capture.reconnected()
        self._status_dirty = True
        self.connected.set()
        log.info("connected to the broker", extra={"device_id": self.device_id})
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._receive(client), name="fleet:receive")
                tg.create_task(self._drain(client), name="fleet:drain")
                tg.create_task(self._upload_diagnostics(client), name="fleet:diagnostics")
                if self.capture is not None:
                    tg.create_task(self._upload(client, self.capture), name="fleet:capture")
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

    def _trust(self) -> TrustRoot:
        return self.trust

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
                models.append(
                    ServedModel(
                        model=name, version=version, sequence=seq, capture=self._capture(name)
                    )
                )
        status = DeviceStatus(
            device_id=self.device_id,
            online=online,
            agent_version=__version__,
            hardware_profile=self.identity.profile,
            labels=dict(self.settings.labels),
            models=models,
            sent_at=datetime.now(UTC),
            telemetry_interval_s=self._telemetry_interval_s(),
            trust_root_version=self.trust.version,
            launcher=self.launcher.report() if online else None,
            twin=self.twin.report() if online else None,
        )
        return status.model_dump_json(exclude_none=True).encode()

    def _capture(self, model: str) -> CaptureStatus | None:
        """``model``'s capture policy and counts, where it has a policy or captured."""
        if self.capture is None:
            return None
        entry = self.manager.models.get(model)
        policy = entry.config.capture if entry is not None else None
        counts = self.capture.tap.snapshot().get(model)
        if counts is None and (policy is None or not policy.enabled):
            return None
        self.capture.shown[model] = counts or ModelCounts()
        spooled, spooled_bytes = self.capture.tap.spool.pending().get(model, (0, 0))
        return CaptureStatus(
            **(policy or CaptureConfig()).model_dump(),
            captured=counts.captured if counts else {},
            uploaded=counts.uploaded if counts else 0,
            dropped=counts.dropped if counts else {},
            spooled=spooled,
            spooled_bytes=spooled_bytes,
        )

    async def _upload(self, client: aiomqtt.Client, uploader: CaptureUploader) -> None:
        """Publish spooled samples on the telemetry topic until acknowledged
        (:mod:`agent.fleet.capture_upload`)."""
        topic = self.topics.telemetry(self.device_id)
        while True:
            uploader.wake.clear()
            now = time.monotonic()
            upload = uploader.next_upload(now)
            if upload is not None:
                payload = upload.model_dump_json().encode()
                await uncancelled(client.publish(topic, payload, qos=1, timeout=10))
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(uploader.next_due_s(now)):
                    await uploader.wake.wait()

    def _telemetry_interval_s(self) -> float:
        """The fleet settings' interval, or the config twin's (a live setting)."""
        value = self.twin.running.get("telemetry_interval_s")
        return float(value) if value is not None else self.settings.telemetry_interval_s

    async def _upload_diagnostics(self, client: aiomqtt.Client) -> None:
        """Publish the answers to log and bundle requests on the telemetry topic, a chunk at
        a time, until acknowledged (:mod:`agent.fleet.diagnostics`)."""
        topic, uploader = self.topics.telemetry(self.device_id), self.diagnostics
        while True:
            uploader.wake.clear()
            upload = await uploader.next_upload(time.monotonic())
            if upload is not None:
                payload = upload.model_dump_json().encode()
                await uncancelled(client.publish(topic, payload, qos=1, timeout=10))
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(uploader.next_due_s(time.monotonic())):
                    await uploader.wake.wait()

    async def _diagnostic_answer(self, command: Command) -> bytes:
        """The logs or the support bundle ``command`` asks for, scrubbed of every secret."""

        async def logs(max_bytes: int) -> bytes:
            path = log_file(self.settings.state_dir)
            return await asyncio.to_thread(
                read_logs,
                path,
                since=command.since,
                until=command.until,
                min_level=command.min_level,
                max_bytes=max_bytes,
            )

        if command.type == CommandType.SUPPORT_BUNDLE:
            parts = {
                "device_id": self.device_id,
                "agent_version": __version__,
                "served": [
                    {"model": e.name, "versions": list(e.served)}
                    for e in self.manager.models.values()
                ],
                "config": self._config,
                "recent_events": [e.model_dump(mode="json") for e in self._events],
                "outbox": {
                    "pending": len(self.outbox),
                    "bytes": self.outbox.size_bytes(),
                    "last_telemetry_seq": self.outbox.last_seq("telemetry"),
                    "dropped": {k: self.outbox.dropped(k) for k in ("telemetry", "event")},
                },
                "metrics": self.metrics.render().decode(errors="replace"),
            }
            data = await fitted_bundle(parts, logs, command.max_bytes or MAX_DIAGNOSTIC_BYTES)
        else:
            data = await logs(command.max_bytes or DEFAULT_LOG_BYTES)
        password = self._password.get_secret_value() if self._password else None
        return scrub(data, (*self._secrets, *([password] if password else [])))

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
        self._events.append(event)
        self.outbox.put(
            self.topics.events(self.device_id), event.model_dump_json().encode(), "event"
        )
        self._wake.set()

    async def _telemetry_loop(self) -> None:
        while True:
            await asyncio.sleep(self._telemetry_interval_s())
            try:
                self._telemetry_round()
            except Exception:
                # one round lost, not the telemetry for good (and with it the fleet client)
                log.exception("telemetry round failed")

    def _telemetry_round(self) -> None:
        if self.launcher.changed():  # a trial committed or rolled back while this agent runs
            self._status_changed()
        if self.capture is not None and self.capture.tap.snapshot() != self.capture.shown:
            self._status_changed()  # the device view shows what was captured
        window, models, device = self.telemetry.collect()
        models = self.shadows.annotate(models)
        taken = self.outcomes.take()
        models = attach(models, taken)
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

        seq = self.outbox.put_numbered(self.topics.telemetry(self.device_id), make, "telemetry")
        if taken and seq is not None:  # in the outbox now: it keeps them until acknowledged
            self.outcomes.sent(taken)
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

    def _parse_desired(self, payload: bytes) -> DesiredState:
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
        return desired

    def _on_desired(self, payload: bytes) -> None:
        desired = self._parse_desired(payload)
        self._last_desired = payload
        now = datetime.now(UTC)
        # an agent release goes to the launcher this agent runs under (agent_release.py)
        # and the config twin to its keeper (twin.py)
        manifests = [
            raw for raw in desired.manifests if not is_agent_release(raw) and not is_twin(raw)
        ]
        for raw in desired.manifests:
            if is_agent_release(raw):
                self.agent_releases.offer(raw)
            elif is_twin(raw):
                self._on_twin(raw)
        # What it no longer lists was withdrawn (a rollout aborted or rolled back): dropped
        # unless already switched to, before anything it does list is queued.
        self.updater.withdraw({claimed(raw.get("signed")) for raw in manifests})
        self.shadows.withdraw(*listed_shadows(manifests))
        for raw in manifests:
            vm = self._verify(raw, now)
            if isinstance(vm, ProtocolError):
                if vm.code == Rejection.REPLAYED and self._converged(vm.model, vm.sequence):
                    # the retained state we already applied (or already refused). Published
                    # again by a new leader or after a broker reset: the status saying so may
                    # have died with a replica that took it unstored, so it goes again (the
                    # rollout engine reads it back; events are not resent, issue 47)
                    self._status_changed()
                    continue
                self._rejected("desired", vm)
                continue
            self._queue(vm)
        if not self.updater.busy:
            self.updater.sweep_staging()  # after a restart: what the crash left and no one wants

    def _on_twin(self, raw: dict[str, object]) -> None:
        """Verify and apply the config twin; a refused one changes nothing (reported as an
        update event of :data:`TWIN_KEY`)."""
        try:
            verified = verify_twin(raw, self.trust, self.device_id, self.twin.version)
        except ProtocolError as exc:
            self._rejected("desired", ProtocolError(exc.code, exc.message, model=TWIN_KEY))
            return
        twin = verified.twin
        if twin.version == self.twin.version:
            return  # the retained copy of the one applied
        applied = self.twin.apply(twin)
        self._status_changed()
        log.info(
            "config twin applied",
            extra={
                "version": twin.version,
                "settings": sorted(applied.settings),
                "rejected": applied.rejected,
            },
        )

    def _verify(self, raw: dict[str, Any], now: datetime) -> VerifiedManifest | ProtocolError:
        """``raw`` verified, or why not (what :meth:`_rejected` reports)."""
        try:
            return verify_manifest(raw, self.trust, self.identity, self._floor, now)
        except ProtocolError as exc:
            return exc
        except Exception as exc:
            # A bug that one manifest trips costs that manifest, not the other models' ones
            # in the same desired state.
            log.exception("manifest verification failed")
            model, sequence = claimed(raw.get("signed"))
            return ProtocolError(
                Rejection.MALFORMED,
                f"manifest could not be verified: {type(exc).__name__}: {exc}",
                model=model,
                sequence=sequence,
            )

    def _queue(self, vm: VerifiedManifest) -> None:
        key = (vm.manifest.model, vm.manifest.sequence)
        if key in self._queued:
            return  # redelivered while still being applied
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

    # -- offline bundles (agent/fleet/bundles.py) -----------------------------------------

    async def _bundle_loop(self) -> None:
        """Take the bundles handed in, at start and every ``bundle_poll_s``: a file dropped
        in a directory has no event to wait on without a dependency (inotify)."""
        while True:
            try:
                self.bundles.sweep()  # what a crash cut short: nothing is being unpacked now
                for path in self.bundles.waiting():
                    await self._take_bundle(path)
            except OSError:
                # the inbox or staging unreadable (a full or failing disk): tried again next
                # round, and the fleet client goes on
                log.exception("the bundle inbox could not be read")
            await asyncio.sleep(self.settings.bundle_poll_s)

    async def _take_bundle(self, path: Path) -> None:
        try:
            results = await self._install_bundle(path)
        except Exception as exc:
            log.exception("installing a bundle failed", extra={"bundle": path.name})
            results = [BundleResult(None, None, None, False, "internal_error", repr(exc))]
        self.bundles.finish(path, results)

    async def _install_bundle(self, path: Path) -> list[BundleResult]:
        """Verify a bundle as the retained desired state is verified (trust root, expiry,
        anti-rollback floor, target), and queue what passes with its files in staging (an
        agent release's in the launcher's downloads, then offered as from MQTT). Unlike the
        retained state, a bundle withdraws nothing it does not list."""
        results: list[BundleResult] = []
        try:
            reader = BundleReader(path, max_desired_bytes=self.settings.max_message_bytes)
            try:
                desired = self._parse_desired(reader.desired())
                verified, releases = self._check_bundle(desired.manifests, results)
                digests = await asyncio.to_thread(self.bundles.unpack, reader, verified)
                for _, release in releases:
                    await asyncio.to_thread(
                        self.bundles.unpack_release, reader, release, self.agent_releases.downloads
                    )
            finally:
                reader.close()
        except ProtocolError as exc:  # the bundle as a whole: nothing of it is queued
            self._rejected("bundle", exc)
            return [*results, refused(exc)]
        self.bundles.place(digests)
        for vm in verified:  # before the next await: a staging sweep would find them unwanted
            self._queue(vm)
            results.append(accepted(vm))
        for raw, release in releases:
            self.agent_releases.offer(raw)
            results.append(BundleResult(AGENT_KEY, release.version, release.sequence, True))
        return results

    def _check_bundle(
        self, manifests: list[dict[str, Any]], results: list[BundleResult]
    ) -> tuple[list[VerifiedManifest], list[tuple[dict[str, Any], AgentReleaseManifest]]]:
        """The bundle's model manifests and agent releases that verify; each refusal reported
        and added to ``results``."""
        now = datetime.now(UTC)
        verified: list[VerifiedManifest] = []
        releases: list[tuple[dict[str, Any], AgentReleaseManifest]] = []
        for raw in manifests:
            checked: VerifiedManifest | AgentReleaseManifest | ProtocolError
            if is_agent_release(raw):
                try:
                    checked = self.agent_releases.check(raw, now)
                except ProtocolError as exc:
                    checked = exc
            else:
                checked = self._verify(raw, now)
            if isinstance(checked, ProtocolError):
                self._rejected("bundle", checked)
                results.append(refused(checked))
            elif isinstance(checked, AgentReleaseManifest):
                releases.append((raw, checked))
            else:
                verified.append(checked)
        return verified, releases

    def _floor(self, model: str) -> int | None:
        ms = self.state.models.get(model)
        return ms.floor() if ms else None

    def _converged(self, model: str | None, sequence: int | None) -> bool:
        ms = self.state.models.get(model or "")
        return ms is not None and ms.applied(sequence)

    def _on_ack(self, payload: bytes) -> None:
        try:
            ack = FleetAck.validate_json(payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "message"
            raise ProtocolError(Rejection.MALFORMED, f"{where}: {first['msg']}") from None
        if ack.device_id != self.device_id:
            raise ProtocolError(Rejection.WRONG_TARGET, f"acknowledgement for {ack.device_id}")
        if isinstance(ack, DiagnosticAck):
            self.diagnostics.acknowledged(ack)
            return
        if isinstance(ack, CaptureAck):
            if self.capture is not None:
                self.capture.acknowledged(ack.sample_ids)
            return
        self.outbox.acknowledge_telemetry(ack.seqs)

    def _on_command(self, payload: bytes) -> None:
        command = verify_command(payload, self.trust, self.device_id, datetime.now(UTC))
        cid = command.command_id
        if cid in self.state.executed_commands or cid in self._commands_queued:
            return
        if is_diagnostic(command):
            log.info("diagnostic requested", extra={"command_id": cid, "type": command.type})
            self.state.executed_commands = [*self.state.executed_commands, cid][
                -REMEMBERED_COMMANDS:
            ]
            self.files.save_state(self.state)
            self.diagnostics.request(command)
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
