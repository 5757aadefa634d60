"""The agent's settings: defaults, then an optional TOML file, then ``EDGEFLEET_AGENT_*``
environment variables (``__`` for nesting), then command-line flags.

The front ends' settings are here, REST's in the root and gRPC's as its ``[grpc]`` section:
the front ends read the root (through :class:`agent.serving.state.ServingState`), so their
sections cannot live in their own packages without an import cycle. The areas below them keep
theirs (``agent/fleet/settings.py``, ``agent/pipelines/settings.py``, ``agent/shm/settings.py``,
``runtimes/settings.py``), since they never import this module."""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from agent.fleet.settings import FleetSettings
from agent.generative.settings import GenerativeSettings
from agent.inference.predictions import GroundTruthSettings
from agent.pipelines.settings import PipelineSettings
from agent.shm.settings import SharedMemorySettings
from common.settings import settings_from
from common.tracing import TracingSettings
from runtimes.settings import RuntimeSettings


class SettingsError(Exception):
    """A setting that validates but that the agent cannot start with (a model repository that
    does not exist); the message names the setting and how to set it."""


class GrpcCoreLog(StrEnum):
    """What gRPC core itself writes on stderr (``GRPC_VERBOSITY``), in absl's text format."""

    NONE = "none"
    """Nothing: every line of the agent's log stays one JSON object."""
    ERROR = "error"
    INFO = "info"
    """Also what ``GRPC_TRACE`` turns on."""
    DEBUG = "debug"


class GrpcSettings(BaseModel):
    """The gRPC endpoint's settings (``[grpc]``, ``EDGEFLEET_AGENT_GRPC__*``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = False
    """Serve KServe V2 / Triton gRPC beside REST. Off by default: one more open port is a
    choice to make."""
    host: str = "127.0.0.1"
    """Address to listen on; loopback by default, as REST (beyond loopback needs API keys,
    as REST)."""
    port: int | None = Field(default=8001, ge=0, le=65535)
    """TCP port (Triton's gRPC port by default); 0 picks a free one; ``"none"`` (or an empty
    ``EDGEFLEET_AGENT_GRPC__PORT``) serves only ``uds``."""
    uds: Path | None = None
    """Also listen on this Unix socket (``unix:<path>`` for clients): no TCP stack between a
    local app and the agent."""
    uds_mode: int = 0o660
    """File permissions of the Unix socket."""
    max_receive_message_bytes: int = Field(default=64 * 2**20, gt=0)
    """Largest request message; larger ones get RESOURCE_EXHAUSTED before they are parsed."""
    max_send_message_bytes: int = Field(default=256 * 2**20, gt=0)
    """Largest response message."""
    shutdown_grace_s: float = Field(default=5.0, ge=0)
    """On shutdown, how long RPCs in flight may take to finish before they are cancelled."""
    core_log: GrpcCoreLog = GrpcCoreLog.NONE
    """gRPC core's own lines on stderr, for debugging it: not JSON. The agent logs the calls
    it refuses or fails itself, as JSON."""

    @field_validator("port", mode="before")
    @classmethod
    def _none(cls, value: Any) -> Any:
        # TOML and environment variables have no null: "none" or "" stands for it
        if isinstance(value, str) and value.strip().lower() in ("", "none"):
            return None
        return value


class PayloadLogSettings(BaseModel):
    """Where payload records go (``[payload_log]``), for the models whose config enables them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: Path | None = None
    """A JSON-lines file; at ``max_file_bytes`` it becomes ``<path>.1`` (one kept)."""
    url: str | None = None
    """An HTTP sink: records POSTed as a JSON array, up to 100 at a time, at least every
    second."""
    max_file_bytes: int = Field(default=64 * 2**20, gt=0)
    queue_records: int = Field(default=1024, gt=0)
    """Records waiting to be written; beyond this they are dropped (and counted), so a slow
    sink never slows a request."""


class CaptureSettings(BaseModel):
    """Where the samples of models with ``[capture] enabled`` are spooled (``[capture]``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spool_file: Path | None = None
    """The spool (SQLite); None: ``capture.sqlite3`` in the fleet's ``state_dir``, and no
    capture for a local-only agent."""
    queue_samples: int = Field(default=256, gt=0)
    """Samples waiting to be written; beyond this they are dropped (counted as
    ``queue_full``), so capture never slows a request."""


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="EDGEFLEET_AGENT_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        hide_input_in_errors=True,  # an error about the whole model would print its secrets
    )

    model_repository: Path = Path("models")
    """Directory of models: <model>/<version>/<file>, optional <model>/config.toml. A local-only
    agent refuses to start when it does not exist; one that follows a fleet creates it."""

    host: str = "127.0.0.1"
    """Address to listen on. Loopback by default: expose the endpoint on purpose."""
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port; 0 picks a free one."""
    uds: Path | None = None
    """Listen on this Unix socket instead of TCP."""
    uds_mode: int = 0o660
    """File permissions of the Unix socket."""

    profile: str = "auto"
    """Hardware profile name, or auto to detect it."""
    profiles_dir: Path | None = None
    """Directory of hardware profile TOML files (default: the shipped ones)."""
    hardware_root: Path = Path("/")
    """Root of /proc, /sys, /dev and /etc for detection (tests point it at a fake tree)."""

    runtime: RuntimeSettings = RuntimeSettings()
    """Runtime tuning: threads, graph optimisation, compiled-model cache, OpenVINO hints."""

    max_request_bytes: int = Field(default=64 * 2**20, gt=0)
    """Largest request body accepted, after decompression."""
    max_tensor_elements: int = Field(default=16 * 2**20, gt=0)
    """Largest number of elements in one input tensor."""
    max_rows_per_request: int = Field(default=4096, gt=0)
    """Most rows (batch dimension) in one request."""
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On SIGTERM, how long in-flight requests may take to finish."""
    keep_alive_s: float = Field(default=5.0, gt=0)
    """Idle keep-alive time of a client connection (also: a new connection that sends nothing)."""
    max_header_bytes: int = Field(default=64 * 2**10, gt=0)
    """Largest request line plus headers; 431 beyond."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """Time a client has to send a whole request head once it started it; 408 beyond."""
    body_timeout_s: float = Field(default=60.0, gt=0)
    """Time a client has to send a whole request body after its head; 408 beyond."""
    max_connections: int = Field(default=1024, gt=0)
    """Open client connections; requests on connections beyond get 503 and are closed."""
    max_concurrent_requests: int = Field(default=256, gt=0)
    """Requests in flight at once (health probes aside); more get an immediate 503."""
    max_inflight_body_bytes: int | None = Field(default=None, gt=0)
    """Request bodies all connections may hold at once, in bytes, from a request's head to
    its response: a body whose declared length would pass it gets 503 with Retry-After before
    it is read (413 if it alone is over it), a chunked one as soon as it grows past it. Unset:
    a quarter of the memory budget models may use (the hardware profile's), at least 64 MiB and
    at most 1 GiB (256 MiB where memory is unknown), and never under ``max_request_bytes``. A
    quarter because a body's memory is only the start: decoding makes its tensors (about as
    much again) and the models need the rest; 1 GiB of bodies already outruns what a device's
    event loop decodes in a body deadline, and 64 MiB admits one largest body by default."""

    api_key: SecretStr | None = None
    """Require this key (``Authorization: Bearer`` or ``X-API-Key``) on every endpoint but
    ``api_key_open_paths``. Never logged."""
    api_keys_file: Path | None = None
    """File of accepted keys, one per line as ``<client name>:<key>`` or ``<key>``; ``#``
    comments (a bare key must not contain a colon). Read at start-up; adds to ``api_key``."""
    api_key_open_paths: tuple[str, ...] = ("/v2/health/live", "/v2/health/ready")
    """Paths served without a key, for probes."""
    allow_unauthenticated: bool = False
    """Listen beyond loopback without API keys. Off, an agent told to listen on any other
    address (``0.0.0.0``, a LAN address, a host name) refuses to start until ``api_key`` or
    ``api_keys_file`` is set: whoever reached that address could otherwise run, load and unload
    its models. A Unix socket (``uds``) is guarded by its file mode instead."""
    rate_limit_per_s: float | None = Field(default=None, gt=0)
    """Requests per second per client (per API key, or per address without keys); 429 with
    Retry-After beyond. Off when unset."""
    rate_limit_burst: int = Field(default=20, gt=0)
    """Requests a client may send at once before the rate applies (the bucket's size)."""
    forwarded_allow_ips: tuple[str, ...] = ()
    """Reverse proxies (addresses or networks) whose ``X-Forwarded-For`` and
    ``X-Forwarded-Proto`` name the client, its address for the rate limit among others. None by
    default: believing loopback, as uvicorn does by default, would let any local process name
    itself a new address for every request and never run out of its rate limit."""

    strict_readiness: bool = True
    """Ready only when every model loaded from the repository serves (Triton's default); off,
    ready when at least one model serves. Either way an empty repository is ready (as Triton)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    access_log: bool = True
    """Log every request (failures are logged regardless)."""
    device_hourly_cost: float | None = Field(default=None, ge=0)
    """Cost of the device per hour, for the cost-per-1000-predictions metric."""

    fleet: FleetSettings = FleetSettings()
    """The fleet client (MQTT); off unless fleet.mqtt_url is set."""
    grpc: GrpcSettings = GrpcSettings()
    """KServe V2 / Triton gRPC beside REST (off by default), on its own port and Unix socket."""
    shared_memory: SharedMemorySettings = SharedMemorySettings()
    """Triton's system shared memory extension: limits and who may register regions."""
    pipelines: PipelineSettings = PipelineSettings()
    """Models' processing steps: image limits, step timeouts, Python steps (off by default)."""
    generative: GenerativeSettings = GenerativeSettings()
    """Generative models (the OpenAI-compatible front end): sequences at once, the KV-cache
    budget, the wait queue, prefill chunks."""
    tracing: TracingSettings = TracingSettings()
    """OpenTelemetry traces of requests over OTLP (off by default)."""
    payload_log: PayloadLogSettings = PayloadLogSettings()
    """Where the payload records of models with ``[payload_log] enabled`` go."""
    capture: CaptureSettings = CaptureSettings()
    """Where captured samples wait for upload (docs/model-quality.md, "Data capture")."""
    ground_truth: GroundTruthSettings = GroundTruthSettings()
    """How many predictions of models with ``[ground_truth]`` are kept, and how long, for the
    outcomes apps post later (``POST /v2/models/{model}/feedback``)."""

    @model_validator(mode="after")
    def _exposed_needs_a_key(self) -> AgentSettings:
        if (
            self.uds is None
            and not is_loopback(self.host)
            and self.api_key is None
            and self.api_keys_file is None
            and not self.allow_unauthenticated
        ):
            raise ValueError(
                f"host {self.host!r} is beyond loopback and no API key is set: set api_key or "
                "api_keys_file (EDGEFLEET_AGENT_API_KEY, EDGEFLEET_AGENT_API_KEYS_FILE), listen "
                "on 127.0.0.1 or a Unix socket (uds), or, on a network you trust, set "
                "allow_unauthenticated (EDGEFLEET_AGENT_ALLOW_UNAUTHENTICATED=true)"
            )
        grpc = self.grpc
        if (
            grpc.enabled
            and grpc.port is not None
            and not is_loopback(grpc.host)
            and self.api_key is None
            and self.api_keys_file is None
            and not self.allow_unauthenticated
        ):
            raise ValueError(
                f"grpc.host {grpc.host!r} is beyond loopback and no API key is set: set "
                "api_key or api_keys_file, listen on 127.0.0.1 or grpc.uds, or set "
                "allow_unauthenticated"
            )
        return self

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


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``); a host name is not, since
    what it resolves to may change."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_settings(config_file: Path | None = None, **overrides: object) -> AgentSettings:
    return settings_from(AgentSettings, config_file, **overrides)
