"""The control plane's settings: defaults, an optional TOML file, ``EDGEFLEET_CP_*`` variables
(``__`` for nesting), then command-line flags.

A leaf: every area imports its settings from here, and this package imports no area. The
nested sections are its modules: :mod:`.enrolment`, :mod:`.drift`, :mod:`.ground_truth`
and :mod:`.kubernetes`."""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from common.settings import settings_from
from common.tracing import TracingSettings
from control_plane.settings.drift import DriftSettings
from control_plane.settings.enrolment import EnrolmentSettings
from control_plane.settings.ground_truth import GroundTruthSettings
from control_plane.settings.kubernetes import KubernetesSettings


class ControlPlaneSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="EDGEFLEET_CP_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        hide_input_in_errors=True,  # an error about the whole model would print its secrets
    )

    db_url: str = "sqlite+aiosqlite:///var/control-plane/edgefleet.db"
    """SQLAlchemy URL: sqlite+aiosqlite:///path or postgresql+psycopg://user@host/db."""
    mqtt_url: str = "mqtt://127.0.0.1:1883"
    mqtt_username: str | None = None
    """The control plane's broker user (``edgefleet fleet`` names it edgefleet-control-plane);
    not used with mutual TLS, where the certificate's name is the username."""
    mqtt_password: SecretStr | None = None
    """Never logged. Prefer ``mqtt_password_file``: a password in the config or the
    environment is seen by whatever reads those."""
    mqtt_password_file: Path | None = None
    """A file whose content is the broker password, a trailing newline dropped (``edgefleet
    fleet init`` writes it, mode 0600). Read at start-up; unreadable, start-up stops. Not
    together with ``mqtt_password``."""
    mqtt_tls_ca_file: Path | None = None
    mqtt_tls_cert_file: Path | None = None
    """Client certificate for a broker that requires mutual TLS (see ``edgefleet fleet``)."""
    mqtt_tls_key_file: Path | None = None
    """Private key of ``mqtt_tls_cert_file``; never logged."""
    mqtt_max_message_bytes: int = Field(default=2**20, gt=0)
    """Larger device messages (status, telemetry, events) are refused unread."""
    mqtt_client_id: str = Field(
        default_factory=lambda: f"edgefleet-control-plane-{socket.gethostname()}"[:64]
    )
    """Stable across restarts: the broker keeps the session, and what devices publish while
    the control plane restarts waits there for it."""
    mqtt_session_expiry_s: int = Field(default=24 * 3600, ge=0)
    mqtt_shared_group: str | None = None
    """Subscribe through $share/<group>/... so several control planes (replicas on one
    PostgreSQL database, each with its own ``mqtt_client_id``) split the ingest. Its session
    then ends with its connection (no ``mqtt_session_expiry_s``): a broker keeps dispatching a
    share to a member's offline session (eclipse/mosquitto#1747), where a dead replica's share
    would wait; the devices send again what was never acknowledged (docs/scaling.md)."""
    leader_lease_ttl_s: float = Field(default=6.0, gt=0)
    """Replicas on PostgreSQL: how long the leader's lease lasts unrenewed; a killed leader's
    loops (rollouts, deployments, maintenance) move to another replica within this plus
    ``leader_renew_interval_s`` (control_plane.leadership)."""
    leader_renew_interval_s: float = Field(default=1.5, gt=0)
    """How often the leader renews its lease, and a follower tries to take it."""
    topic_prefix: str = "edgefleet"
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    public_url: str | None = None
    """Base URL devices fetch artifacts from (default http://host:port)."""
    state_dir: Path = Path("var/control-plane")
    """Signing keys, the bootstrap admin token, scratch space."""
    artifact_dir: Path = Path("var/control-plane/artifacts")
    signing_key_file: Path | None = None
    """Ed25519 PEM that signs manifests (default state_dir/keys/manifest.pem, created if absent).
    A rotation keeps the key it replaces beside it as ``manifest-<key id>.pem``; start-up refuses
    a key the trust root does not list, unless such an archived key is listed (signs with that)."""
    root_key_file: Path | None = None
    """Ed25519 PEM that signs trust root updates (default state_dir/keys/root.pem), created on
    the very first start only. Keep it offline in production: it is read at start-up if present,
    else when ``keys rotate`` or ``keys revoke`` needs it (put it back for those, no restart). A
    key that is not a root key of the current trust root stops start-up and is refused."""
    max_upload_bytes: int = Field(default=4 * 2**30, gt=0)
    """A model file or sample upload over this is refused (413) as it streams in."""
    max_json_body_bytes: int = Field(default=2**20, gt=0)
    """A JSON request body (a version, a stage, labels, a rollout, a token) over this is refused
    (413) as it is read, once its token and role are checked; uploads have ``max_upload_bytes``."""
    manifest_ttl_s: float = Field(default=30 * 24 * 3600, gt=0)
    """How long a signed manifest stays valid on devices."""
    telemetry_raw_retention_s: float = Field(default=2 * 24 * 3600, gt=0)
    telemetry_rollup_retention_s: float = Field(default=30 * 24 * 3600, gt=0)
    telemetry_rollup_s: float = Field(default=60.0, gt=0)
    """Downsampling bucket."""
    maintenance_interval_s: float = Field(default=60.0, gt=0)
    rollout_tick_s: float = Field(default=1.0, gt=0)
    """How often rollouts check timers (bake times, device timeouts); events act at once."""
    rollout_send_chunk_devices: int = Field(default=1000, gt=0)
    """Devices of a wave sent their manifests per transaction, each committed and published
    before the next is signed (control_plane.rollouts.sending)."""
    deployment_tick_s: float = Field(default=5.0, gt=0)
    """How often continuous deployments look for devices out of compliance (that joined, or
    were relabelled) to give a rollout of their own."""
    ingest_batch_size: int = Field(default=500, gt=0)
    ingest_max_delay_s: float = Field(default=0.2, gt=0)
    """Longest a device event or status waits to be written with others."""
    ingest_telemetry_delay_s: float = Field(default=1.0, gt=0)
    """Longest telemetry waits to be written with other telemetry: fewer, larger commits. When
    the telemetry tables were indexed by device (before revision 0004), a batch dirtied a page
    per device in each index and a longer batch put more rows on each: at 5,000 devices and
    15,000 messages/s, 1 s batches held the control plane at 0.39-0.46 of a core while the
    tables grew, where 0.2 s ones climbed from 0.57 to 0.86. An event or status in the batch
    cuts the wait to ``ingest_max_delay_s``."""
    telemetry_ack_interval_s: float = Field(default=2.0, gt=0)
    """How often each device is told which of its telemetry messages are stored (one message
    per device with news, ranges of sequence numbers; a device reporting every 10 s gets at
    most one for each report): the device keeps each message until then, so this stays well
    under its ``fleet.telemetry_resend_s`` (8 s)."""
    mqtt_broker_inflight: int = Field(default=20, ge=1, le=65535)
    """Unacknowledged QoS 1 messages the broker sends the control plane at once: the Receive
    Maximum it asks for, and Mosquitto also holds it to its ``max_inflight_messages`` (20 by
    default). Device messages are acknowledged only once stored, so a batch is written as soon
    as this many wait: raise both together (1,000 lets one batch carry a second of a large
    fleet's telemetry). The cyclic collector's youngest threshold follows it
    (``control_plane.app.gc_thresholds``)."""
    last_seen_resolution_s: float = Field(default=5.0, ge=0)
    """A device's ``last_seen`` in the inventory is rewritten once it has moved this far."""
    presence_timeout_s: float = Field(default=60.0, ge=0)
    """A device whose last status is online but from which nothing has come for longer than
    this, or than three of the telemetry intervals it announced if that is longer, is shown as
    silent, not online (its last will may never have been published; control_plane.ingest.presence).
    0 turns the check off."""
    validation_rtol: float = Field(default=1e-3, gt=0)
    validation_atol: float = Field(default=1e-3, gt=0)
    accuracy_margin: float = Field(default=0.01, ge=0)
    """A version's accuracy may be at most this much below the production version's."""
    console_live_interval_s: float = Field(default=5.0, gt=0)
    """How often an open console page that updates itself reads what it shows: a telemetry
    page (``/ui/telemetry``) gets a live point (the fleet counters and 50 telemetry windows
    per chart), an active rollout's page its progress (the rollout with every device row)."""
    log_level: str = "INFO"
    enrolment: EnrolmentSettings = EnrolmentSettings()
    """Zero-touch provisioning: where claimed devices get their broker user (docs/enrolment.md)."""
    drift: DriftSettings = DriftSettings()
    """Input drift against each version's reference set (docs/model-quality.md, "Drift")."""
    ground_truth: GroundTruthSettings = GroundTruthSettings()
    """Live accuracy from the outcomes apps post, and concept drift against the reference's
    (docs/model-quality.md, "Ground truth and live accuracy")."""
    kubernetes: KubernetesSettings = KubernetesSettings()
    """ModelRollout objects and the agent DaemonSet, when run in a cluster (docs/kubernetes.md)."""
    tracing: TracingSettings = TracingSettings()
    """OpenTelemetry spans of API calls over OTLP (off by default; the ``tracing`` extra)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    @model_validator(mode="after")
    def _one_broker_password(self) -> ControlPlaneSettings:
        if self.mqtt_password is not None and self.mqtt_password_file is not None:
            raise ValueError("give mqtt_password or mqtt_password_file, not both")
        return self

    @model_validator(mode="after")
    def _lease_renewed_in_time(self) -> ControlPlaneSettings:
        if self.leader_renew_interval_s * 2 > self.leader_lease_ttl_s:
            raise ValueError(
                "leader_renew_interval_s must be at most half of leader_lease_ttl_s "
                "(the leader stops acting one renewal before its lease runs out)"
            )
        return self

    def artifact_base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")


def load_settings(config_file: Path | None = None, **overrides: object) -> ControlPlaneSettings:
    return settings_from(ControlPlaneSettings, config_file, **overrides)
