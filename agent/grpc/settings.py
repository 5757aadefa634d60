"""The gRPC endpoint's settings (``[grpc]``, ``EDGEFLEET_AGENT_GRPC__*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class GrpcSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

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

    @field_validator("port", mode="before")
    @classmethod
    def _none(cls, value: Any) -> Any:
        # TOML and environment variables have no null: "none" or "" stands for it
        if isinstance(value, str) and value.strip().lower() in ("", "none"):
            return None
        return value
