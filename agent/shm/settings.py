"""System shared memory settings (``[shared_memory]``, ``EDGEFLEET_AGENT_SHARED_MEMORY__*``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SharedMemorySettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    """Accept region registrations. Only regions owned by the agent's own user (or
    ``allowed_group``) are accepted: a process of that user could read the agent's memory
    anyway, so a region gives it nothing it did not have."""
    root: str = "/dev/shm"
    """Where POSIX shared memory objects live (``shm_open`` names are files there)."""
    allowed_group: str | None = None
    """A group (name or numeric id) whose regions may be registered too, for apps that run
    as another user of that group."""
    max_regions: int = Field(default=64, gt=0)
    """Registered regions at once."""
    max_total_bytes: int = Field(default=2**30, gt=0)
    """Bytes of all registered regions together (their ``byte_size``)."""
