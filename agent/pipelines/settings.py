"""Pipeline settings, nested in the agent's as ``pipelines`` (``EDGEFLEET_AGENT_PIPELINES__*``)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class PythonSteps(StrEnum):
    """Where a model's own Python steps may run (docs/pipelines.md, "Python steps")."""

    OFF = "off"
    """Never: a version with a Python step fails to load."""
    VERIFIED = "verified"
    """Only in versions the fleet delivered with a verified manifest: staged by the updater
    after it verified the signature and every file's digest, or, after a restart, whose
    ``.digests.json`` (written at that install) still matches every file of the directory."""
    ANY = "any"
    """Also in a local repository's versions: whoever can write the repository directory
    runs code as the agent's user."""


class PipelineSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    python_steps: PythonSteps = PythonSteps.OFF
    """Whether models' Python steps may run; off by default (it is code pushed to devices)."""
    max_image_pixels: int = Field(default=16_000_000, gt=0)
    """Largest image (width x height) an image step decodes; 413 beyond, read from the header
    before the pixels are decoded."""
    max_request_pixels: int = Field(default=32_000_000, gt=0)
    """Pixels of all the images of one request together (each image decoded holds 3 bytes a
    pixel in RGB); 413 beyond, from the headers, before any is decoded."""
    max_decoded_pixels: int = Field(default=64_000_000, gt=0)
    """Pixels of decoded images alive at once across all requests and pipelines (about 192 MB
    in RGB); a request whose images would pass it is answered 503 with Retry-After (one alone
    may always decode, within ``max_request_pixels``)."""
    step_timeout_s: float = Field(default=10.0, gt=0)
    """Longest one step may take unless its config says; 504 beyond (a Python step's worker is
    then replaced)."""
    step_threads: int = Field(default=0, ge=0)
    """Threads that run built-in steps (Pillow and numpy release the GIL); 0: one per CPU."""
    python_worker_memory_mb: int = Field(default=1024, gt=0)
    """Address-space limit of each process of a Python step's worker (RLIMIT_AS), and the
    memory of all its processes together (``memory.max``) where the agent has a delegated
    cgroup v2."""
    python_worker_cpu_s: int = Field(default=30, gt=0)
    """CPU seconds one call of a Python step may use (RLIMIT_CPU); the worker dies beyond."""
    python_worker_max_processes: int = Field(default=64, ge=4)
    """Processes and threads a Python step's worker may hold at once, its launcher and init
    included (RLIMIT_NPROC in its own user namespace; ``pids.max`` in a delegated cgroup v2);
    a fork past it fails, and a call that fails so is a 502 that ends all the step started."""
