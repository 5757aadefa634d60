"""The control plane's composition root."""

from __future__ import annotations

import logging
import os

import uvicorn
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from common.logs import configure_logging
from common.server import GracefulServer
from control_plane.api.deps import Services
from control_plane.app import create_app
from control_plane.db.session import make_engine, migrate, session_factory
from control_plane.ingest.ingestor import Ingestor
from control_plane.ingest.presence import SilenceRule
from control_plane.leadership.lease import Leadership
from control_plane.metrics import FleetMetrics
from control_plane.mqtt.bus import FleetBus
from control_plane.registry.store import ArtifactStore
from control_plane.rollouts.engine import RolloutEngine
from control_plane.rollouts.tracing import RolloutSpans
from control_plane.settings import ControlPlaneSettings
from control_plane.signing.keys import KeyRing, load_key, load_or_create_key
from control_plane.signing.trust import TrustManager

log = logging.getLogger("edgefleet.control_plane")


def with_broker_password(settings: ControlPlaneSettings) -> ControlPlaneSettings:
    """``settings`` with ``mqtt_password`` read from ``mqtt_password_file``, if one is set.

    Raises:
        SystemExit: the file cannot be read (one line, ``Error: ...``, as the CLI's errors).
    """
    path = settings.mqtt_password_file
    if path is None:
        return settings
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SystemExit(f"Error: mqtt_password_file {path}: {reason}") from None
    # NOTE: `echo secret > file` and editors end the file with a newline; no password does
    password = SecretStr(text.rstrip("\r\n"))
    return settings.model_copy(update={"mqtt_password": password, "mqtt_password_file": None})


def build(settings: ControlPlaneSettings) -> tuple[Services, TrustManager]:
    settings = with_broker_password(settings)
    migrate(settings.db_url)
    engine = make_engine(settings.db_url)
    sessions = session_factory(engine)
    keys_dir = settings.state_dir / "keys"
    manifest_path = settings.signing_key_file or keys_dir / "manifest.pem"
    root_path = settings.root_key_file or keys_dir / "root.pem"
    # The root key is never created here: it may be kept offline (None). TrustManager.ensure
    # creates it on the very first start only, when there is no trust root yet.
    keys = KeyRing(
        load_or_create_key(manifest_path),
        load_key(root_path),
        manifest_path,
        root_key_path=root_path,
    )
    # the rule is ingest's; metrics counts by it and imports no area
    silence = SilenceRule(settings.presence_timeout_s, settings.last_seen_resolution_s)
    metrics = FleetMetrics(silence)
    ingestor = Ingestor(
        sessions,
        metrics,
        batch_size=settings.ingest_batch_size,
        max_delay_s=settings.ingest_max_delay_s,
        telemetry_delay_s=settings.ingest_telemetry_delay_s,
        ack_window=settings.mqtt_broker_inflight,
        last_seen_resolution_s=settings.last_seen_resolution_s,
    )
    bus = FleetBus(settings, ingestor)
    # replicas share a PostgreSQL database and elect a leader; on SQLite there is one replica
    leadership = Leadership(
        sessions,
        f"{settings.mqtt_client_id}:{os.getpid()}",
        single=make_url(settings.db_url).get_backend_name() == "sqlite",
        ttl_s=settings.leader_lease_ttl_s,
        renew_interval_s=settings.leader_renew_interval_s,
    )
    leadership.on_leader.append(lambda lead: metrics.leader_seen(lead.leader, lead.leading))
    metrics.leader_seen(leadership.leader, leadership.leading)
    spans, provider = RolloutSpans(), None
    if settings.tracing.enabled:  # imported only then: a control plane that does not trace
        from control_plane.rollouts.tracing import TracedRollouts  # never loads the SDK

        traced = TracedRollouts(settings.tracing)
        spans, provider = traced, traced.provider
    rollouts = RolloutEngine(
        sessions,
        bus,
        keys,
        metrics,
        manifest_ttl_s=settings.manifest_ttl_s,
        artifact_base_url=settings.artifact_base_url(),
        tick_s=settings.rollout_tick_s,
        leadership=leadership,
        send_chunk=settings.rollout_send_chunk_devices,
        spans=spans,
    )
    ingestor.listeners.append(rollouts.on_events)
    ingestor.on_device_online.append(rollouts.on_device_online)
    store = ArtifactStore(settings.artifact_dir, settings.max_upload_bytes)
    services = Services(
        settings, sessions, store, keys, bus, ingestor, rollouts, metrics, silence, provider
    )
    trust = TrustManager(sessions, keys, bus, settings.state_dir)
    # rollback commands it lost reach their devices at their next birth (rollouts.on_births)
    bus.on_broker_state_lost += [trust.ensure, rollouts.republish_desired]
    ingestor.on_births.append(rollouts.on_births)
    return services, trust


def run(settings: ControlPlaneSettings) -> None:
    configure_logging(settings.log_level)
    services, trust = build(settings)
    app = create_app(services, trust)
    if settings.kubernetes.enabled:
        from control_plane.k8s.lifespan import attach  # the kubernetes client only then

        attach(app, services.engine, services.sessions, settings.kubernetes)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        server_header=False,
        timeout_graceful_shutdown=10,
    )
    GracefulServer(config).run()
