"""The agent's composition root: build settings, wire the parts, serve."""

from __future__ import annotations

import logging
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn
from fastapi import APIRouter
from starlette.responses import Response

from agent.accelerators import AcceleratorProbe
from agent.api.app import create_app
from agent.fleet.diagnostics import BundleSources, log_file, redacted, secret_values
from agent.http.limits import HttpLimits, default_body_budget_bytes
from agent.http.protocol import protocol_class
from agent.inference.capture import CaptureTap
from agent.inference.capture_spool import CaptureSpool
from agent.inference.manager import ModelManager
from agent.inference.payload_log import PayloadLog
from agent.inference.predictions import PredictionStore
from agent.inference.service import InferenceService
from agent.inference.sketches import InputSketchBook
from agent.inference.versions import RuntimeFactory
from agent.metrics import AgentMetrics
from agent.serving.state import ServingState
from agent.settings import AgentSettings, SettingsError
from agent.shm.regions import SharedMemoryRegistry
from agent.systemd import SystemdNotifier
from agent.tracing import Tracing
from common.logs import configure_logging
from common.server import GracefulServer
from runtimes.backends import open_model
from runtimes.formats import is_generative
from runtimes.hardware.context import HardwareContext

if TYPE_CHECKING:
    from agent.fleet.client import FleetClient
    from agent.generative.models import GenerativeModels

log = logging.getLogger("edgefleet.agent")


def build_state(
    settings: AgentSettings,
    hardware: HardwareContext | None = None,
    runtime_factory: RuntimeFactory = open_model,
) -> ServingState:
    """Wire the agent. ``runtime_factory`` is the seam tests use to wrap runtimes. The
    state's settings are ``settings`` with the kept config twin over them (:func:`with_twin`):
    serve with those."""
    settings = with_twin(settings)
    hardware = hardware or HardwareContext.detect(
        root=settings.hardware_root, profiles_dir=settings.profiles_dir, profile=settings.profile
    )
    accelerators = AcceleratorProbe(settings.hardware_root)
    metrics = AgentMetrics(hourly_cost=settings.device_hourly_cost, accelerators=accelerators)
    cpu_count = hardware.facts.usable_cpus
    manager = ModelManager(
        settings.model_repository,
        hardware,
        settings.runtime,
        cpu_count=cpu_count,
        metrics=metrics,
        runtime_factory=runtime_factory,
        pipelines=settings.pipelines,
    )
    metrics.bind(manager)
    sketching = settings.fleet.enabled and settings.fleet.input_sketches.enabled
    sketches = InputSketchBook(settings.fleet.input_sketches) if sketching else None
    service = InferenceService(
        manager,
        metrics,
        max_rows_per_request=settings.max_rows_per_request,
        sketches=sketches,
        payloads=build_payload_log(settings, metrics),
        predictions=PredictionStore(settings.ground_truth),
        capture=build_capture(settings, metrics),
    )
    if service.capture is not None:
        manager.shadows.on_disagreement = service.capture_disagreement
    log.info(
        "hardware profile", extra={"profile": hardware.profile.name, "forced": hardware.forced}
    )

    def make_generative() -> GenerativeModels:
        # imported here: an agent without generative models never loads the token loop
        from agent.generative.models import GenerativeModels

        return GenerativeModels(
            settings.model_repository,
            hardware,
            settings.runtime,
            settings.generative,
            registry=metrics.registry,
            runtime_factory=runtime_factory,
        )

    generative = None
    if any(is_generative(p) for p in _model_dirs(settings.model_repository)):
        generative = make_generative()
    state = ServingState(
        service,
        manager,
        metrics,
        settings,
        shared_memory=SharedMemoryRegistry(settings.shared_memory),
        generative=generative,
        tracing=build_tracing(settings),
    )
    if settings.fleet.enabled:
        state.fleet = _fleet_client(state, hardware, accelerators, sketches, make_generative)
    return state


def _fleet_client(
    state: ServingState,
    hardware: HardwareContext,
    accelerators: AcceleratorProbe,
    sketches: InputSketchBook | None,
    make_generative: Callable[[], GenerativeModels],
) -> FleetClient:
    """The fleet client of ``state``'s agent; it stages generative versions into
    ``state.generative``, built on the first one where the repository held none."""
    # imported here: a local-only agent never loads MQTT and signature code
    from agent.fleet.client import FleetClient
    from agent.fleet.stagers import GenerativeStager
    from agent.fleet.twin import TwinKeeper, running_settings

    def first_generative() -> GenerativeModels:
        # the front ends (mounted for a fleet agent) find the models from now on
        state.generative = make_generative()
        return state.generative

    return FleetClient(
        state.settings.fleet,
        state.manager,
        hardware,
        accelerators,
        state.metrics,
        sketches=sketches,
        generative=GenerativeStager(state.generative, first_generative),
        predictions=state.service.predictions,
        capture=state.service.capture,
        twin=TwinKeeper(state.settings.fleet.state_dir, running_settings(state.settings)),
        bundle=BundleSources(redacted(state.settings), agent_secrets(state.settings)),
    )


def _model_dirs(repository: Path) -> list[Path]:
    try:
        return [p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def with_twin(settings: AgentSettings) -> AgentSettings:
    """``settings`` with the config twin the fleet set laid over them (agent/fleet/twin.py)."""
    if not settings.fleet.enabled:
        return settings
    # imported here: a local-only agent never loads the fleet's code
    from agent.fleet import twin

    return twin.with_twin(settings)


def build_payload_log(settings: AgentSettings, metrics: AgentMetrics) -> PayloadLog | None:
    """The payload log's writer where ``[payload_log]`` names a file or a URL."""
    sink = settings.payload_log
    if sink.path is None and sink.url is None:
        return None
    return PayloadLog(
        sink.path,
        sink.url,
        max_file_bytes=sink.max_file_bytes,
        queue_records=sink.queue_records,
        on_drop=metrics.payload_dropped.inc,
    )


def build_capture(settings: AgentSettings, metrics: AgentMetrics) -> CaptureTap | None:
    """The capture writer and its spool, where there is somewhere to spool to."""
    path = settings.capture.spool_file
    if path is None and settings.fleet.enabled:
        path = settings.fleet.state_dir / "capture.sqlite3"
    if path is None:
        return None
    return CaptureTap(CaptureSpool(path), metrics, queue_samples=settings.capture.queue_samples)


def build_tracing(settings: AgentSettings) -> Tracing | None:
    """OpenTelemetry's tracer where ``[tracing] enabled``; the SDK is imported only then."""
    if not settings.tracing.enabled:
        return None
    try:
        return Tracing(settings.tracing)
    except ImportError as exc:
        raise SettingsError(
            f"tracing.enabled needs the OpenTelemetry SDK and its OTLP exporter ({exc.name} "
            "is missing): pip install 'edgefleet[tracing]'"
        ) from None


_HOW_TO_SET = "--model-repository DIR or EDGEFLEET_AGENT_MODEL_REPOSITORY"


def check_repository(settings: AgentSettings) -> None:
    """Refuse a model repository the agent could never serve from, before anything starts.

    A local-only agent serves only what its directory holds: a missing one is a mistyped path
    far more often than a wish to serve nothing, so it is an error. An agent that follows a
    fleet gets its models from the fleet: its store creates the directory, and an empty one is
    how every new device starts. An empty directory of a local-only agent is served (ready,
    as Triton is) with a warning.

    Raises:
        SettingsError: the directory does not exist (local-only), is not a directory, or
            cannot be read.
    """
    path = settings.model_repository
    following = settings.fleet.enabled
    try:
        with os.scandir(path) as entries:
            # the manager's notion of a model: a directory not hidden (the fleet's .staging)
            models = [e.name for e in entries if e.is_dir() and not e.name.startswith(".")]
    except FileNotFoundError:
        if following:
            log.info(
                "model repository does not exist yet: the fleet's models will be stored there",
                extra={"repository": str(path)},
            )
            return
        raise SettingsError(
            f"model repository {path} does not exist: create it, or name the right directory "
            f"with {_HOW_TO_SET}"
        ) from None
    except NotADirectoryError:
        raise SettingsError(
            f"model repository {path} is not a directory: name one with {_HOW_TO_SET}"
        ) from None
    except OSError as exc:
        raise SettingsError(
            f"model repository {path} cannot be read ({exc.strerror or exc}): give the agent's "
            f"user access, or name another directory with {_HOW_TO_SET}"
        ) from None
    if models:
        return
    if following:
        log.info(
            "model repository is empty: waiting for the fleet's desired state",
            extra={"repository": str(path)},
        )
    else:
        log.warning(
            "model repository is empty: there is nothing to serve (ready, as Triton is)",
            extra={"repository": str(path), "setting": "model_repository"},
        )


def make_socket_directories(settings: AgentSettings) -> None:
    """Make the directory of each Unix socket the agent listens on (mode 0750) if it is
    missing, before anything starts: gRPC's core aborts the whole process (SIGABRT) on a
    socket path whose directory does not exist.

    Raises:
        SettingsError: a directory cannot be made, naming the setting.
    """
    for setting, path in (("uds", settings.uds), ("grpc.uds", settings.grpc.uds)):
        if path is None or (setting == "grpc.uds" and not settings.grpc.enabled):
            continue
        directory = Path(path).parent
        try:
            directory.mkdir(mode=0o750, parents=True, exist_ok=True)
        except OSError as exc:
            raise SettingsError(
                f"{setting}: cannot make the directory of socket {path} ({exc.strerror}); make "
                "it, or choose a path in a directory the agent may write"
            ) from None
        if not directory.is_dir():
            raise SettingsError(f"{setting}: {directory} is not a directory")


def bind_socket(settings: AgentSettings) -> socket.socket:
    """Bind before serving, so the Unix socket gets its permissions before anyone connects
    and a port of 0 is known to the caller."""
    if settings.uds is not None:
        path = settings.uds
        if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # never world-accessible, not even for an instant
        try:
            sock.bind(str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, settings.uds_mode)
    else:
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((settings.host, settings.port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def server_config(settings: AgentSettings, state: ServingState) -> uvicorn.Config:
    body_budget = settings.max_inflight_body_bytes or default_body_budget_bytes(
        state.manager.hardware.memory_budget_bytes, settings.max_request_bytes
    )
    routers: tuple[APIRouter, ...] = ()
    answers: tuple[tuple[frozenset[str], Callable[[Exception], Response]], ...] = ()
    if state.serves_generative:
        # imported here: an agent without generative models never loads the front end
        from agent.openai.errors import OPENAI_PATHS, openai_error_response
        from agent.openai.routes import router as openai_router

        routers, answers = (openai_router,), ((OPENAI_PATHS, openai_error_response),)
    app = create_app(state, routers, answers)
    if settings.grpc.enabled and state.shared_memory is not None:
        # imported here: an agent without gRPC never loads grpcio
        from agent.grpc.server import GrpcServer, WithGrpc

        app = WithGrpc(app, GrpcServer(state, state.shared_memory))
    return uvicorn.Config(
        app,
        loop="uvloop",
        http=protocol_class(
            HttpLimits(
                max_header_bytes=settings.max_header_bytes,
                header_timeout_s=settings.header_timeout_s,
                body_timeout_s=settings.body_timeout_s,
                max_connections=settings.max_connections,
                max_concurrent_requests=settings.max_concurrent_requests,
                open_paths=frozenset(p.encode() for p in settings.api_key_open_paths),
                whole_body_bytes=settings.max_request_bytes,
                max_inflight_body_bytes=body_budget,
            ),
            state.metrics.count_refusal,
        ),
        lifespan="on",
        ws="none",  # no WebSocket routes: an upgrade is refused by the protocol (agent.http)
        log_config=None,
        access_log=False,
        # uvicorn types both as int but hands them to call_later and asyncio.timeout, which
        # take seconds as floats: int() made a keep-alive under 1 s 0 (every connection closed
        # after its first response) and a grace under 1 s 0 (requests in flight cancelled at
        # once)
        timeout_graceful_shutdown=settings.shutdown_grace_s,  # type: ignore[arg-type]
        timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]
        server_header=False,
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=list(settings.forwarded_allow_ips) or None,
    )


def agent_secrets(settings: AgentSettings) -> tuple[str, ...]:
    """What no log line nor answer to a log or bundle request may carry: every SecretStr
    setting, and the keys in the claim token and API keys files."""
    found = secret_values(settings)
    for path in (settings.fleet.claim_token_file, settings.api_keys_file):
        try:
            lines = path.read_text().splitlines() if path is not None else []
        except (OSError, UnicodeDecodeError):
            continue
        for line in (x.strip() for x in lines):
            if line and not line.startswith("#"):
                found.append(line.partition(":")[2].strip() or line)
    return tuple(found)


def configure_agent_logging(settings: AgentSettings) -> None:
    """JSON lines on stderr and, with a fleet, in ``state_dir/logs`` (a remote log request
    reads them); no line carries a secret of ``settings``."""
    fleet = settings.fleet
    configure_logging(
        settings.log_level,
        file=log_file(fleet.state_dir) if fleet.enabled else None,
        file_max_bytes=fleet.log_file_max_bytes,
        secrets=agent_secrets(settings),
    )


def run(settings: AgentSettings) -> None:
    settings = with_twin(settings)  # before the logging is set up (build_state does it too)
    configure_agent_logging(settings)
    if settings.grpc.enabled:
        # read by gRPC core when grpcio loads, in server_config: set before
        from agent.grpc.core_environment import core_environment

        os.environ.update(core_environment(settings.grpc))
    check_repository(settings)
    make_socket_directories(settings)
    state = build_state(settings)
    sock = bind_socket(settings)
    where = str(settings.uds) if settings.uds else "http://{}:{}".format(*sock.getsockname()[:2])
    log.info(
        "agent listening", extra={"address": where, "repository": str(settings.model_repository)}
    )
    # systemd's variables are its protocol, not settings: read (and unset) here, once
    notifier = SystemdNotifier.from_environment(os.environ, state)
    server = GracefulServer(server_config(settings, state), notifier)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        if settings.uds is not None:
            Path(settings.uds).unlink(missing_ok=True)
