"""One simulated device: the agent's fleet protocol without inference or downloads.

It does what :mod:`agent.fleet.client` and :mod:`agent.fleet.updater` do on the wire, in the
same order: a retained birth status with a retained will; telemetry (QoS 1); the trust root,
desired state and commands subscribed; every manifest verified against the trust root with
:func:`common.protocol.verify.verify_manifest` (signature, expiry, anti-rollback sequence,
target, artifact) and every command with :func:`~common.protocol.verify.verify_command`; update
states reported as the updater reports them:

    received -> downloading (0.0) -> downloading (1.0) -> verified -> staged -> active
             -> (the manifest's health window) -> committed, then a new status

What it skips, on purpose: the artifact fetch and digest check (the "downloading" states are
reported with no bytes moved; a version already on the device skips them, as the real store
does), the model load and the self-test. Rollback commands switch back to the previous
version and report ``rolled_back`` with code ``fleet_command``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from benchmarks.fleet.mqttlite import MqttLite
from common.protocol.errors import ProtocolError, Rejection
from common.protocol.messages import (
    Command,
    DesiredState,
    DeviceStatus,
    ModelTelemetry,
    ServedModel,
    Telemetry,
    UpdateEvent,
    UpdateState,
)
from common.protocol.signing import TrustRoot, apply_trust_update, parse_envelope
from common.protocol.topics import Topics
from common.protocol.verify import DeviceIdentity, VerifiedManifest, verify_command, verify_manifest

AGENT_VERSION = "fleetsim"
PROFILE = "generic-x86_64"
TIME_MARK = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass
class Shared:
    """What every simulated device of one process shares: wire names and the counters the
    benchmark reads."""

    topics: Topics
    model: str
    labels: dict[str, str]
    telemetry_interval_s: float | None = None
    """Announced in the birth message, as an agent does (the control plane's silence limit)."""
    marks: dict[str, list[float]] = field(default_factory=dict)
    """monotonic() times at which devices published a committed / rolled_back event."""
    rejected: dict[str, int] = field(default_factory=dict)
    events_sent: int = 0

    def mark(self, state: str) -> None:
        self.marks.setdefault(state, []).append(time.monotonic())


class SimDevice:
    def __init__(self, device_id: str, shared: Shared, trust: TrustRoot, version: int) -> None:
        self.device_id = device_id
        self.shared = shared
        self.trust = trust
        self.identity = DeviceIdentity(device_id, PROFILE, dict(shared.labels), frozenset({"onnx"}))
        t = shared.topics
        self.status_topic, self.telemetry_topic = t.status(device_id), t.telemetry(device_id)
        self.events_topic = t.events(device_id)
        self.desired_topic, self.commands_topic = t.desired(device_id), t.commands(device_id)
        self.committed_version: int = version
        self.committed_sequence: int | None = None
        self.previous_version: int | None = None
        self.failed_sequence: int | None = None
        self.installed = {version}
        self.executed: list[str] = []
        self.queued: set[int] = set()
        self.seq = 0
        self.conn: MqttLite | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._template = ""
        self._template_version = -1

    # -- outgoing ---------------------------------------------------------------------------

    def status(self, *, online: bool) -> bytes:
        models = []
        if online:
            models = [
                ServedModel(
                    model=self.shared.model,
                    version=self.committed_version,
                    sequence=self.committed_sequence,
                )
            ]
        return (
            DeviceStatus(
                device_id=self.device_id,
                online=online,
                agent_version=AGENT_VERSION,
                hardware_profile=PROFILE,
                labels=dict(self.shared.labels),
                models=models,
                telemetry_interval_s=self.shared.telemetry_interval_s,
                sent_at=datetime.now(UTC),
            )
            .model_dump_json(exclude_none=True)
            .encode()
        )

    def publish_status(self) -> None:
        assert self.conn is not None
        self.conn.publish(self.status_topic, self.status(online=True), qos=1, retain=True)

    def telemetry(self, now_iso: str, topic: str | None = None) -> None:
        """Publish one telemetry message (QoS 1) from a template: pydantic built its shape
        once per served version, only ``seq`` and ``time`` change."""
        if self._template_version != self.committed_version:
            body = Telemetry(
                device_id=self.device_id,
                seq=1,
                time=TIME_MARK,
                window_s=10.0,
                models=[
                    ModelTelemetry(
                        model=self.shared.model,
                        version=self.committed_version,
                        requests=120,
                        errors=0,
                        rows=120,
                        batches=40,
                        p50_ms=1.2,
                        p95_ms=2.5,
                        p99_ms=3.1,
                        mean_batch_size=3.0,
                    )
                ],
            ).model_dump_json(exclude_none=True)
            mark = TIME_MARK.isoformat().replace("+00:00", "Z")
            self._template = body.replace('"seq":1,', '"seq":%d,').replace(mark, "%s")
            self._template_version = self.committed_version
        self.seq += 1
        assert self.conn is not None
        payload = (self._template % (self.seq, now_iso)).encode()
        self.conn.publish(topic or self.telemetry_topic, payload, qos=1)

    def report(
        self,
        state: UpdateState,
        version: int | None,
        sequence: int | None,
        rollout_id: str | None = None,
        code: str | None = None,
        reason: str | None = None,
        progress: float | None = None,
    ) -> None:
        event = UpdateEvent(
            device_id=self.device_id,
            event_id=uuid.uuid4().hex,
            time=datetime.now(UTC),
            model=self.shared.model,
            version=version,
            sequence=sequence,
            rollout_id=rollout_id,
            state=state,
            code=code,
            reason=reason,
            progress=progress,
        )
        assert self.conn is not None
        self.conn.publish(self.events_topic, event.model_dump_json().encode(), qos=1)
        self.shared.events_sent += 1
        if state in (UpdateState.COMMITTED, UpdateState.ROLLED_BACK):
            self.shared.mark(state.value)

    # -- incoming ---------------------------------------------------------------------------

    def on_message(self, topic: str, payload: bytes) -> None:
        if not payload:
            return  # a cleared retained message
        try:
            if topic == self.desired_topic:
                self._on_desired(payload)
            elif topic == self.commands_topic:
                self._on_command(payload)
            elif topic == self.shared.topics.trust:
                envelope = parse_envelope(payload)
                if envelope.signed.get("version") != self.trust.version:
                    self.trust = apply_trust_update(self.trust, envelope)
        except ProtocolError as exc:
            self._rejected(exc)

    def _rejected(self, exc: ProtocolError) -> None:
        self.shared.rejected[exc.code.value] = self.shared.rejected.get(exc.code.value, 0) + 1
        self.report(
            UpdateState.REJECTED, None, exc.sequence, code=exc.code.value, reason=exc.message
        )

    def _floor(self, model: str) -> int | None:
        seqs = [s for s in (self.committed_sequence, self.failed_sequence) if s is not None]
        return max(seqs) if seqs and model == self.shared.model else None

    def _on_desired(self, payload: bytes) -> None:
        try:
            desired = DesiredState.model_validate_json(payload)
        except ValidationError as exc:
            raise ProtocolError(Rejection.MALFORMED, f"desired state: {exc}") from None
        if desired.device_id != self.device_id:
            raise ProtocolError(Rejection.WRONG_TARGET, f"desired state for {desired.device_id}")
        now = datetime.now(UTC)
        for raw in desired.manifests:
            try:
                vm = verify_manifest(raw, self.trust, self.identity, self._floor, now)
            except ProtocolError as exc:
                converged = exc.sequence in (self.committed_sequence, self.failed_sequence)
                if exc.code == Rejection.REPLAYED and converged:
                    continue  # the retained state already applied
                self._rejected(exc)
                continue
            m = vm.manifest
            if m.sequence in self.queued:
                continue
            self.queued.add(m.sequence)
            self.report(UpdateState.RECEIVED, m.version, m.sequence, m.rollout_id)
            self._spawn(self._apply(vm))

    def _on_command(self, payload: bytes) -> None:
        command = verify_command(payload, self.trust, self.device_id, datetime.now(UTC))
        if command.command_id in self.executed:
            return
        self.executed = [*self.executed, command.command_id][-32:]
        self._spawn(self._rollback(command))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"sim:{self.device_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the updater, minus downloads and inference ----------------------------------------

    async def _apply(self, vm: VerifiedManifest) -> None:
        m = vm.manifest
        async with self._lock:
            try:
                if m.sequence in (self.committed_sequence, self.failed_sequence):
                    return  # a copy queued while this one was applied: already reported
                floor = self._floor(m.model)
                if floor is not None and m.sequence < floor:  # as the agent's updater
                    self.report(
                        UpdateState.REJECTED,
                        m.version,
                        m.sequence,
                        m.rollout_id,
                        Rejection.SUPERSEDED.value,
                        f"sequence {m.sequence} is not newer than {floor}",
                    )
                    return
                if m.version not in self.installed:  # the fetch itself is skipped
                    self.report(
                        UpdateState.DOWNLOADING, m.version, m.sequence, m.rollout_id, progress=0.0
                    )
                    self.report(
                        UpdateState.DOWNLOADING, m.version, m.sequence, m.rollout_id, progress=1.0
                    )
                for state in (UpdateState.VERIFIED, UpdateState.STAGED, UpdateState.ACTIVE):
                    self.report(state, m.version, m.sequence, m.rollout_id)
                if m.health.window_s > 0:
                    await asyncio.sleep(m.health.window_s)
                if self.committed_version != m.version:
                    self.previous_version = self.committed_version
                self.committed_version, self.committed_sequence = m.version, m.sequence
                self.installed = {m.version} | (
                    {self.previous_version} if self.previous_version is not None else set()
                )
                self.report(UpdateState.COMMITTED, m.version, m.sequence, m.rollout_id)
                self.publish_status()
            finally:
                self.queued.discard(m.sequence)

    async def _rollback(self, command: Command) -> None:
        async with self._lock:
            target, seq = self.previous_version, self.committed_sequence
            if command.from_version is not None and self.committed_version != command.from_version:
                reason = f"runs version {self.committed_version}, not {command.from_version}"
            elif target is None:
                reason = f"no previous version of {command.model} is kept on this device"
            else:
                self.committed_version, self.previous_version = target, None
                self.report(
                    UpdateState.ROLLED_BACK,
                    target,
                    seq,
                    code=Rejection.FLEET_COMMAND.value,
                    reason=command.reason or "rollback requested by the fleet",
                )
                self.publish_status()
                return
            code = Rejection.NOTHING_TO_ROLL_BACK.value
            self.report(UpdateState.REJECTED, target, seq, code=code, reason=reason)
