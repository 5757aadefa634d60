"""The control plane's tables (SQLAlchemy 2). Schema changes go through Alembic migrations
(``control_plane/migrations``); a test fails when these models and the migrations differ."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from control_plane.db.states import DeviceRolloutState, RolloutState

NAME_LENGTH = 128
"""Width of the name columns (models, devices, tokens): PostgreSQL refuses a longer value, so
the API refuses it first."""


E = TypeVar("E", bound=StrEnum)


class StateColumn(TypeDecorator[E]):
    """A ``StrEnum`` stored as its value in a ``VARCHAR(32)``, read back as the enum: the
    schema is the plain string column the migrations made."""

    impl = String(32)
    cache_ok = True

    def __init__(self, enum: type[E]) -> None:
        super().__init__()
        self.enum = enum

    def process_bind_param(self, value: E | None, dialect: Dialect) -> str | None:
        return None if value is None else self.enum(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> E | None:
        return None if value is None else self.enum(value)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: DateTime(timezone=True)}


class Model(Base):
    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    next_sequence: Mapped[int] = mapped_column(BigInteger, default=1)
    """Manifest sequences for this model: every manifest the fleet issues takes the next."""
    created_at: Mapped[datetime]
    versions: Mapped[list[ModelVersion]] = relationship(
        back_populates="model", order_by="ModelVersion.version"
    )


class ModelVersion(Base):
    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    version: Mapped[int] = mapped_column(Integer)
    stage: Mapped[str] = mapped_column(String(32), default="candidate")
    """candidate, production or retired."""
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """Serving configuration sent to devices (config.toml keys)."""
    health: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """Device-side health window criteria."""
    variants: Mapped[list[Any]] = mapped_column(default=list)
    """[{format, profiles, files: [{name, sha256, size}], signature}]"""
    golden: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    validation_data: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    validation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """The last validation report: passed, checks, accuracy."""
    reference: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """The reference set (reference.npz: inputs with labels or expected outputs)."""
    optimisation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """The last optimisation report: each kind of variant built, refused or unavailable."""
    source: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """Where the files came from when not from directories: {kind: "mlflow",
    registered_model, version, run_id, alias, tracking_uri} (migration 0021)."""
    uploaded_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]
    model: Mapped[Model] = relationship(back_populates="versions")


class Artifact(Base):
    """A stored file, addressed by its digest; versions reference files by sha256."""

    __tablename__ = "artifacts"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]


AGENT_KEY = "@agent"
"""The key of an agent release's manifest in :attr:`Device.desired` and of its rollouts'
``model``: no model can be called so (a model name is letters, digits, '.', '_', '-')."""


class AgentRelease(Base):
    """An agent release in the registry: a release tree's ``.tar.gz`` stored by digest."""

    __tablename__ = "agent_releases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[str] = mapped_column(String(64), unique=True)
    sequence: Mapped[int] = mapped_column(BigInteger, unique=True)
    """Fleet-wide and increasing: the devices' anti-rollback line for agent releases."""
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    description: Mapped[str] = mapped_column(Text, default="")
    uploaded_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]


class Device(Base):
    __tablename__ = "devices"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    hardware_profile: Mapped[str | None] = mapped_column(String(128), nullable=True)
    agent_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reported_labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    operator_labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """Labels added by operators; they win over what the device reports."""
    models: Mapped[list[Any]] = mapped_column(default=list)
    """What the device serves: [{model, version, sequence}]"""
    online: Mapped[bool] = mapped_column(Boolean, default=False)
    last_seen: Mapped[datetime | None] = mapped_column(nullable=True)
    """When the control plane last heard from the device (its clock, not the device's)."""
    telemetry_interval_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    """How often the device said it publishes telemetry (its birth message)."""
    trust_root_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The trust root version the device said it holds (its birth message; none from an agent
    that predates the field)."""
    desired: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """Per model, the signed manifest envelope this device should converge to."""
    launcher: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """What the launcher under the agent last said (a ``LauncherReport``); None: none."""
    twin_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """The version of the last config twin signed for this device (0: none yet)."""
    twin_reported: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """What the device last said of its config twin (a ``TwinReport``); None: nothing."""

    @property
    def labels(self) -> dict[str, str]:
        return {**self.reported_labels, **self.operator_labels}


class Rollout(Base):
    __tablename__ = "rollouts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    sequence: Mapped[int] = mapped_column(BigInteger)
    manifest: Mapped[dict[str, Any]] = mapped_column()
    """The signed envelope every targeted device receives."""
    selector: Mapped[dict[str, Any]] = mapped_column(default=dict)
    profiles: Mapped[list[Any]] = mapped_column(default=list)
    waves: Mapped[list[Any]] = mapped_column()
    """Cumulative sizes, e.g. ["1", "10%", "50%", "100%"]."""
    bake_time_s: Mapped[float] = mapped_column(Float)
    device_timeout_s: Mapped[float] = mapped_column(Float)
    gates: Mapped[dict[str, Any]] = mapped_column()
    state: Mapped[RolloutState] = mapped_column(StateColumn(RolloutState), index=True)
    current_wave: Mapped[int] = mapped_column(Integer, default=0)
    wave_started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    bake_started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    gate_report: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    deployment_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    """The continuous deployment that started it (none: an operator's own rollout)."""
    shadow: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """Its shadow phase: ``{"spec": ShadowSpec, "waves": {wave: state and report}}``
    (:mod:`control_plane.rollouts.shadow`); none without one."""
    trace: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """Its OpenTelemetry trace context and the ids of its spans still open
    (:mod:`control_plane.rollouts.tracing`); none when not traced."""
    agent_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """An agent release's rollout: the release's version (``model`` is then
    :data:`AGENT_KEY`, ``version`` the release's sequence); none for a model's."""
    devices: Mapped[list[RolloutDevice]] = relationship(
        back_populates="rollout", order_by="RolloutDevice.position"
    )


class RolloutDevice(Base):
    __tablename__ = "rollout_devices"
    __table_args__ = (
        UniqueConstraint("rollout_id", "device_id"),
        # a wave's next chunk of pending devices (control_plane.rollouts.sending)
        Index("ix_rollout_devices_pending", "rollout_id", "state", "position"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rollout_id: Mapped[int] = mapped_column(ForeignKey("rollouts.id"), index=True)
    device_id: Mapped[str] = mapped_column(String(128), index=True)
    position: Mapped[int] = mapped_column(Integer)
    wave: Mapped[int] = mapped_column(Integer)
    state: Mapped[DeviceRolloutState] = mapped_column(StateColumn(DeviceRolloutState))
    previous_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    previous_desired: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """The device's desired manifest for the model before this rollout, restored on rollback."""
    sent_at: Mapped[datetime | None] = mapped_column(nullable=True)
    updated_at: Mapped[datetime | None] = mapped_column(nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    rollout: Mapped[Rollout] = relationship(back_populates="devices")


class TelemetrySample(Base):
    """One telemetry window of one model version on one device, as received.

    Indexed for what is written thousands of times a second. The dedupe key starts with the
    time: a message delivered twice has the same time, device and ``seq``, and rows arrive in
    time order, so every batch adds to the end of the index. It also serves retention's range
    by time and a device's windows (a range by time, its device read from the index entries).
    No index starts with the device: one puts every batch on as many pages as it has devices,
    each written whole to SQLite's log, and at 5,000 devices that cost a quarter of ingest's
    CPU per message, growing with the table (a device's last hour is a scan of the fleet's last
    hour of index entries instead: about 0.1 s for 5,000 devices at one message each per
    10 s). The health gates read by (model, version, received_at): a device's clock may be
    off by days, the control plane's is the rollout's."""

    __tablename__ = "telemetry"
    __table_args__ = (
        UniqueConstraint(
            "time", "device_id", "seq", "model", "version", name="uq_telemetry_message"
        ),
        Index("ix_telemetry_model_received", "model", "version", "received_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    device_id: Mapped[str] = mapped_column(String(128))
    seq: Mapped[int] = mapped_column(BigInteger)
    time: Mapped[datetime]
    """When the window ended, by the device's clock."""
    received_at: Mapped[datetime]
    """When the control plane stored the window, by its own clock (the batch's write)."""
    window_s: Mapped[float] = mapped_column(Float)
    model: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    requests: Mapped[int] = mapped_column(Integer)
    errors: Mapped[int] = mapped_column(Integer)
    rows: Mapped[int] = mapped_column(Integer)
    batches: Mapped[int] = mapped_column(Integer)
    p50_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    p95_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    p99_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    queue_depth: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """A generative version's tokens in over the window (0 for a batch model)."""
    generated_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """A generative version's tokens out over the window."""
    ttft_p99_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    """A generative version's p99 time to first token over the window."""
    inter_token_p99_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    """A generative version's p99 time between tokens over the window."""
    cost_per_1k_tokens: Mapped[float | None] = mapped_column(Float, nullable=True)
    """The device's cost over the window per thousand tokens the version generated."""
    busy_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    """The device time the version's batches took in the window (its share of the device)."""


class DeviceSample(Base):
    """The device part of a telemetry message: one row per message, keyed and indexed like the
    ``telemetry`` rows (a message delivered twice is stored once; see there)."""

    __tablename__ = "device_telemetry"
    __table_args__ = (
        UniqueConstraint("time", "device_id", "seq", name="uq_device_telemetry_message"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    device_id: Mapped[str] = mapped_column(String(128))
    seq: Mapped[int] = mapped_column(BigInteger)
    time: Mapped[datetime]
    cpu_percent: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_used_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    temperature_c: Mapped[float | None] = mapped_column(Float, nullable=True)
    dropped: Mapped[int] = mapped_column(Integer, default=0)


class TelemetryRollup(Base):
    """Downsampled telemetry: one bucket per device, model version and interval."""

    __tablename__ = "telemetry_rollups"
    __table_args__ = (UniqueConstraint("device_id", "model", "version", "bucket"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    device_id: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    bucket: Mapped[datetime] = mapped_column(index=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    errors: Mapped[int] = mapped_column(BigInteger)
    rows: Mapped[int] = mapped_column(BigInteger)
    p99_ms_max: Mapped[float | None] = mapped_column(Float, nullable=True)


class CostRate(Base):
    """What an hour of a device costs, set by an operator: for the devices with a label
    (``kind`` ``label``, ``key`` ``name=value``), of a hardware profile (``profile``, the
    profile's name), or every other device (``default``, key ``*``)."""

    __tablename__ = "cost_rates"
    __table_args__ = (UniqueConstraint("kind", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(2 * NAME_LENGTH + 1))
    per_hour: Mapped[float] = mapped_column(Float)
    updated_by: Mapped[str] = mapped_column(String(NAME_LENGTH))
    updated_at: Mapped[datetime]


class UpdateEventRecord(Base):
    __tablename__ = "update_events"
    __table_args__ = (
        Index("ix_update_events_rollout", "rollout_id"),
        Index("ix_update_events_device", "device_id", "id"),  # a device's history
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(64), unique=True)
    device_id: Mapped[str] = mapped_column(String(128))
    time: Mapped[datetime]
    model: Mapped[str] = mapped_column(String(128))
    version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    sequence: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    rollout_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    state: Mapped[str] = mapped_column(String(32))
    code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    progress: Mapped[float | None] = mapped_column(Float, nullable=True)
    bytes_done: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    bytes_total: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    window_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    secret_hash: Mapped[str] = mapped_column(String(128))
    """SHA-256 of the secret part; the token itself is shown once and never stored."""
    created_at: Mapped[datetime]
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class AuditEntry(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    time: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(256))
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)


class TrustRootRecord(Base):
    """Every trust root the control plane published (the newest is current)."""

    __tablename__ = "trust_roots"

    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    envelope: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime]


class Claim(Base):
    """A claim credential: devices that present its token enrol themselves (see
    :mod:`control_plane.enrolment`). Only the SHA-256 of its secret is kept."""

    __tablename__ = "claims"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    secret_hash: Mapped[str] = mapped_column(String(128))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """Operator labels every device it enrols gets (they win over what the device reports)."""
    profiles: Mapped[list[Any]] = mapped_column(default=list)
    """Hardware profiles it may enrol; empty: any."""
    max_uses: Mapped[int] = mapped_column(Integer)
    uses: Mapped[int] = mapped_column(Integer, default=0)
    expires_at: Mapped[datetime]
    require_approval: Mapped[bool] = mapped_column(Boolean, default=False)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]


class Enrolment(Base):
    """A device that presented a claim: pending, approved, rejected or enrolled."""

    __tablename__ = "enrolments"

    device_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    claim_id: Mapped[str] = mapped_column(String(32), index=True)
    key_hash: Mapped[str] = mapped_column(String(128))
    """SHA-256 of the secret the device made for itself: only it may collect its identity."""
    state: Mapped[str] = mapped_column(String(32), index=True)
    hardware_profile: Mapped[str] = mapped_column(String(128))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """What the device asked for (its own labels, reported)."""
    reason: Mapped[str] = mapped_column(Text, default="")
    requested_at: Mapped[datetime]
    decided_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    issued_at: Mapped[datetime | None] = mapped_column(nullable=True)
    """When the device last collected its broker identity."""


class Deployment(Base):
    """A model version bound to a label selector: matching devices converge to it, those that
    match later too (see :mod:`control_plane.deployments`)."""

    __tablename__ = "deployments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    model: Mapped[str] = mapped_column(String(128), index=True)
    version: Mapped[int] = mapped_column(Integer)
    selector: Mapped[dict[str, Any]] = mapped_column(default=dict)
    profiles: Mapped[list[Any]] = mapped_column(default=list)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    """Of two deployments of one model that match a device, the higher wins (tie: newer)."""
    waves: Mapped[list[Any]] = mapped_column()
    bake_time_s: Mapped[float] = mapped_column(Float)
    device_timeout_s: Mapped[float] = mapped_column(Float)
    gates: Mapped[dict[str, Any]] = mapped_column()
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    paused_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    """Who paused it (none: not paused): it starts no rollout, and its running one is paused."""
    paused_at: Mapped[datetime | None] = mapped_column(nullable=True)


class MaintenanceWindow(Base):
    """When the devices of a label selector may start updates (see
    :mod:`control_plane.rollouts.windows`)."""

    __tablename__ = "maintenance_windows"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    selector: Mapped[dict[str, Any]] = mapped_column(default=dict)
    cron: Mapped[str] = mapped_column(String(128))
    """Five fields (minute hour day-of-month month day-of-week): when the window opens."""
    duration_s: Mapped[float] = mapped_column(Float)
    timezone: Mapped[str] = mapped_column(String(64))
    """IANA name (Europe/Paris): the cron fields are read in its local time, DST included."""
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]


class ConfigTwinRow(Base):
    """Desired settings and application keys for one device or a label group
    (:mod:`control_plane.twins`)."""

    __tablename__ = "config_twins"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target: Mapped[str] = mapped_column(String(512), unique=True)
    """``device:<id>`` or ``labels:<k=v,...>`` (sorted): one row per target."""
    device_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    selector: Mapped[dict[str, Any]] = mapped_column(default=dict)
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    app: Mapped[dict[str, Any]] = mapped_column(default=dict)
    updated_by: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[datetime]


class LeaderLease(Base):
    """Who leads the singleton loops (rollouts, deployments, maintenance) among the control
    plane replicas sharing this database (:mod:`control_plane.leadership`)."""

    __tablename__ = "leader_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    """The replica that holds it (its broker client id and process id)."""
    epoch: Mapped[int] = mapped_column(BigInteger)
    """The fencing token: one more at every grant to a new holder, never reused."""
    expires_at: Mapped[datetime]
    """The database's clock: a holder renews before then, or another may take it."""


class ShadowReportRecord(Base):
    """One telemetry window of a candidate staged as a shadow on one device: the sums of
    :class:`~common.protocol.shadow.ShadowReport`, summed again over a wave by its gate."""

    __tablename__ = "shadow_reports"
    __table_args__ = (
        UniqueConstraint("time", "device_id", "seq", "model", name="uq_shadow_report_message"),
        Index("ix_shadow_reports_candidate", "model", "version", "sequence", "received_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    device_id: Mapped[str] = mapped_column(String(NAME_LENGTH))
    seq: Mapped[int] = mapped_column(BigInteger)
    time: Mapped[datetime]
    received_at: Mapped[datetime]
    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    version: Mapped[int] = mapped_column(Integer)
    """The candidate's version."""
    sequence: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    serving_version: Mapped[int] = mapped_column(Integer)
    requests: Mapped[int] = mapped_column(Integer)
    rows: Mapped[int] = mapped_column(Integer)
    matched: Mapped[int] = mapped_column(Integer)
    dropped: Mapped[int] = mapped_column(Integer)
    errors: Mapped[int] = mapped_column(Integer)
    max_abs_diff: Mapped[float | None] = mapped_column(Float, nullable=True)
    rel_error_sum: Mapped[float] = mapped_column(Float)
    candidate_ms_sum: Mapped[float] = mapped_column(Float)
    serving_ms_sum: Mapped[float] = mapped_column(Float)


class GroundTruthRecord(Base):
    """One telemetry window's outcomes of one label group of a model version on one device:
    the sums of :class:`~common.protocol.ground_truth.OutcomeGroup`, summed again over time
    buckets, devices and versions (:mod:`control_plane.quality.accuracy`)."""

    __tablename__ = "ground_truth"
    __table_args__ = (
        UniqueConstraint(
            "time", "device_id", "seq", "model", "version", "label", name="uq_ground_truth_window"
        ),
        Index("ix_ground_truth_version", "model", "version", "received_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    device_id: Mapped[str] = mapped_column(String(NAME_LENGTH))
    seq: Mapped[int] = mapped_column(BigInteger)
    time: Mapped[datetime]
    """The window's time, by the device's clock."""
    received_at: Mapped[datetime]
    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    version: Mapped[int] = mapped_column(Integer)
    task: Mapped[str] = mapped_column(String(32))
    label: Mapped[int] = mapped_column(Integer)
    """The true class; -1 for a regression's outcomes."""
    outcomes: Mapped[int] = mapped_column(Integer)
    correct: Mapped[int] = mapped_column(Integer)
    abs_error_sum: Mapped[float] = mapped_column(Float)
    squared_error_sum: Mapped[float] = mapped_column(Float)


class CapturedSampleRecord(Base):
    """One sample a device captured for retraining (docs/model-quality.md, "Data capture"):
    its tensors as the ``.npz`` archive the device sent, at most
    :data:`~common.protocol.capture.MAX_SAMPLE_BYTES`. Stored once per (device, sample id)."""

    __tablename__ = "captured_samples"
    __table_args__ = (
        UniqueConstraint("device_id", "sample_id", name="uq_captured_samples_device_sample"),
        Index("ix_captured_samples_version", "model", "version", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    device_id: Mapped[str] = mapped_column(String(NAME_LENGTH))
    sample_id: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    version: Mapped[int] = mapped_column(Integer)
    captured_at: Mapped[datetime]
    """By the device's clock."""
    received_at: Mapped[datetime]
    trigger: Mapped[str] = mapped_column(String(32))
    rows: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class VariantSpeedRecord(Base):
    """The latest rows per second a device's batch tuning measured for a model version on a
    hardware profile (which variant a profile gets is the manifest's rule)."""

    __tablename__ = "variant_speeds"
    __table_args__ = (UniqueConstraint("model", "version", "profile", name="uq_variant_speed"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    version: Mapped[int] = mapped_column(Integer)
    profile: Mapped[str] = mapped_column(String(NAME_LENGTH))
    format: Mapped[str] = mapped_column(String(32))
    rows_per_s: Mapped[float] = mapped_column(Float)
    batch_size: Mapped[int] = mapped_column(Integer)
    placement: Mapped[str] = mapped_column(String(NAME_LENGTH), default="")
    device_id: Mapped[str] = mapped_column(String(NAME_LENGTH))
    """The device that measured it last."""
    measured_at: Mapped[datetime]
    """When the control plane received it (its clock)."""


class InputDrift(Base):
    """The latest input drift of a model version on one device, or over the fleet
    (``device_id`` ``*``): its sketches merged over recent windows against the version's
    reference set (:mod:`control_plane.quality.drift_monitor`)."""

    __tablename__ = "input_drift"
    __table_args__ = (UniqueConstraint("model", "version", "device_id", name="uq_input_drift"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    version: Mapped[int] = mapped_column(Integer)
    device_id: Mapped[str] = mapped_column(String(NAME_LENGTH))
    computed_at: Mapped[datetime]
    rows: Mapped[float] = mapped_column(Float)
    """Sampled rows behind it (windows merged with decay: not a whole number)."""
    windows: Mapped[int] = mapped_column(Integer)
    """Telemetry windows with sketches merged so far (summed over devices for the fleet)."""
    psi: Mapped[float] = mapped_column(Float)
    """The largest PSI of any feature."""
    ks: Mapped[float] = mapped_column(Float)
    wasserstein: Mapped[float] = mapped_column(Float)
    feature: Mapped[str] = mapped_column(String(NAME_LENGTH + 32))
    """Where the PSI is largest: ``input[3]``, ``input[*]`` for all of an input's values."""
    features: Mapped[list[Any]] = mapped_column(default=list)
    """Every feature's drift: input, feature, psi, ks, wasserstein, live and reference mean."""


class DriftSketch(Base):
    """What the drift monitor holds of one device's windows of one model version: their
    sketches merged with decay, and the last telemetry ``seq`` merged. Every replica merges
    into it and judges from it, and a restarted one goes on from it
    (:mod:`control_plane.quality.drift_monitor`)."""

    __tablename__ = "drift_sketches"
    __table_args__ = (UniqueConstraint("model", "version", "device_id", name="uq_drift_sketches"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    version: Mapped[int] = mapped_column(Integer)
    device_id: Mapped[str] = mapped_column(String(NAME_LENGTH))
    last_seq: Mapped[int] = mapped_column(BigInteger)
    """The newest telemetry message merged (``sketch["seqs"]``: the last ones merged, so that
    none sent again is merged twice)."""
    rows: Mapped[float] = mapped_column(Float)
    windows: Mapped[int] = mapped_column(Integer)
    over: Mapped[bool] = mapped_column(Boolean, default=False)
    """Over the alert threshold when last judged (an alert is raised once per crossing)."""
    sketch: Mapped[dict[str, Any]] = mapped_column(JSON)
    """Each input's relative accuracy and each feature's bins, count and total."""
    updated_at: Mapped[datetime] = mapped_column(index=True)


class DeviceDiagnostic(Base):
    """An operator's request for a device's logs or support bundle, and its answer as the
    device uploaded it (docs/operations.md, "Seeing a device's logs"): at most
    :data:`~common.protocol.diagnostics.MAX_DIAGNOSTIC_BYTES`, appended chunk by chunk."""

    __tablename__ = "device_diagnostics"
    __table_args__ = (Index("ix_device_diagnostics_device", "device_id", "requested_at"),)

    id: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    """The signed command's ``command_id``."""
    device_id: Mapped[str] = mapped_column(String(NAME_LENGTH))
    kind: Mapped[str] = mapped_column(String(32))
    """``logs`` or ``support-bundle``."""
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    requested_by: Mapped[str] = mapped_column(String(NAME_LENGTH))
    requested_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    state: Mapped[str] = mapped_column(String(16))
    """``pending``, ``uploading``, ``complete`` or ``failed``."""
    total_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    received_bytes: Mapped[int] = mapped_column(Integer, default=0)
    data: Mapped[bytes] = mapped_column(LargeBinary, default=b"")
    error: Mapped[str | None] = mapped_column(String(500), nullable=True)
    completed_at: Mapped[datetime | None] = mapped_column(nullable=True)
