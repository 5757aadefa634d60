"""Fleet client settings, nested in the agent's as ``fleet`` (``EDGEFLEET_AGENT_FLEET__*``)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from agent.inference.sketches import InputSketchSettings
from common.protocol.topics import valid_device_id


class FleetSettings(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        hide_input_in_errors=True,  # an error about the whole model would print its secrets
    )

    mqtt_url: str | None = None
    """mqtt://host:port or mqtts://host:port; None turns the fleet client off."""
    device_id: str = Field(default_factory=lambda: _default_device_id())
    """This device's id: one MQTT topic level ([A-Za-z0-9._-], at most 128)."""
    topic_prefix: str = "edgefleet"
    username: str | None = None
    password: SecretStr | None = None
    """Broker password; never logged."""
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    """Client certificate for mutual TLS."""
    tls_key_file: Path | None = None
    mqtt_protocol: Literal["5", "3.1.1"] = "5"
    max_message_bytes: int = Field(default=2**20, gt=0)
    """Larger MQTT messages (desired state, command, trust root) are refused unread."""
    bundle_poll_s: float = Field(default=1.0, gt=0)
    """How often the agent looks in ``state_dir/bundles`` for an offline bundle handed in by
    ``edgefleet bundle install`` (and at start)."""
    keepalive_s: int = Field(default=30, ge=5)
    will_delay_s: int = Field(default=0, ge=0, le=24 * 3600)
    """MQTT 5: the broker publishes the device's last will (offline) only if it has not
    reconnected within this many seconds, so a brief drop of the link or a quick restart does
    not show it offline and back. 0: at once. A clean shutdown says offline itself, at once."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Reported in the birth message; rollouts select on them (site, group...)."""
    state_dir: Path = Path("var/agent-state")
    """Trust root, applied sequences and the offline outbox live here."""
    trust_root_file: Path | None = None
    """The provisioned trust root (JSON), read when state_dir holds none yet."""
    launcher_journal_file: Path | None = None
    """The journal of the launcher this agent runs under (``edgefleet launcher run`` sets it):
    its release, crash loop and last trial go into the birth message. None: no launcher."""
    telemetry_interval_s: float = Field(default=10.0, gt=0)
    input_sketches: InputSketchSettings = Field(default_factory=InputSketchSettings)
    """Sketches of served inputs in each telemetry window, for drift (docs/model-quality.md)."""
    outbox_max_bytes: int = Field(default=16 * 2**20, gt=0)
    """Bound of the on-disk buffer for telemetry and events while offline."""
    outbox_max_age_s: float = Field(default=7 * 24 * 3600, gt=0)
    """Telemetry and events older than this leave the buffer, counted as dropped."""
    telemetry_resend_s: float = Field(default=8.0, gt=0)
    """How long a telemetry message the broker took waits for the control plane's
    acknowledgement before it is sent again (doubling per try up to
    ``telemetry_resend_max_s``); a reconnect sends every unacknowledged one at once. Short,
    though past the control plane's ``telemetry_ack_interval_s`` (2 s): what a dying replica
    took and did not store comes again within seconds of another taking over."""
    telemetry_resend_max_s: float = Field(default=900.0, gt=0)
    log_file_max_bytes: int = Field(default=2**20, ge=4096)
    """The agent's log lines are also kept in ``state_dir/logs/agent.jsonl``, rotated at this
    size with 3 older files (4x this on disk at most), to answer a remote log request."""
    max_artifact_bytes: int = Field(default=2 * 2**30, gt=0)
    download_attempts: int = Field(default=5, ge=1)
    download_timeout_s: float = Field(default=30.0, gt=0)
    """Per network operation (connect, each read), not for the whole file."""
    reconnect_min_s: float = Field(default=0.5, gt=0)
    reconnect_max_s: float = Field(default=30.0, gt=0)
    keep_versions: int = Field(default=2, ge=1)
    """Versions of a fleet-managed model kept on disk (the committed one and the one before)."""
    enrol_url: str | None = None
    """Zero-touch provisioning: the control plane's URL (https://host:port) the claim token is
    exchanged at, on the first start, for this device's broker identity and the trust root
    (kept in state_dir; docs/enrolment.md). Use https beyond a trusted network: the answer
    carries the device's password and the keys it will trust."""
    claim_token: SecretStr | None = None
    """The claim token (``efc_...``) an operator created; never logged. Prefer
    ``claim_token_file``."""
    claim_token_file: Path | None = None
    """A file whose content is the claim token (trailing newline dropped)."""
    enrol_retry_max_s: float = Field(default=300.0, gt=0)
    """Longest wait between enrolment attempts while the control plane is away (doubling from
    ``reconnect_min_s``); a pending device waits as long as the control plane says."""

    @field_validator("device_id")
    @classmethod
    def _topic_safe(cls, value: str) -> str:
        if not valid_device_id(value):
            raise ValueError("use letters, digits, '.', '_' or '-' (at most 128)")
        return value

    @field_validator("mqtt_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
                raise ValueError("expected mqtt://host[:port] or mqtts://host[:port]")
        return value

    @model_validator(mode="after")
    def _will_delay_needs_v5(self) -> FleetSettings:
        if self.will_delay_s and self.mqtt_protocol != "5":
            raise ValueError("will_delay_s needs mqtt_protocol 5 (MQTT 3.1.1 has no will delay)")
        return self

    @model_validator(mode="after")
    def _claim_needs_url(self) -> FleetSettings:
        if (self.claim_token or self.claim_token_file) and not self.enrol_url:
            raise ValueError("a claim token needs enrol_url, the control plane's URL")
        if self.claim_token and self.claim_token_file:
            raise ValueError("give claim_token or claim_token_file, not both")
        return self

    @property
    def enrols(self) -> bool:
        """Whether a claim is configured (used at the first start only)."""
        return self.enrol_url is not None and bool(self.claim_token or self.claim_token_file)

    @property
    def enabled(self) -> bool:
        return self.mqtt_url is not None

    def broker(self) -> tuple[str, int, bool]:
        parts = urlsplit(self.mqtt_url or "")
        tls = parts.scheme == "mqtts"
        return parts.hostname or "127.0.0.1", parts.port or (8883 if tls else 1883), tls


def _default_device_id() -> str:
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:128]
    return name if valid_device_id(name) else "device"
