"""The memory and CPU limits of the agent's control group: what a container may really use.

``/proc/meminfo`` and ``/proc/cpuinfo`` describe the host. In a container (the k3s DaemonSet
sets ``limits.memory: 2Gi``; ``docker run --memory --cpus``) the kernel kills the agent at its
control group's memory limit and throttles it at its CPU quota, whatever the host has. A memory
budget taken as a share of the host's RAM then lets the agent load models past the limit and be
OOM-killed, and one ONNX Runtime thread per host core under a quota of two CPUs spends its time
throttled. So both limits are read here, through the same root seam as the rest of the probe.

cgroup v2 (one hierarchy, ``0::/path`` in ``/proc/self/cgroup``): ``memory.max`` and
``cpu.max`` of the agent's group and of every group above it, the smallest applying. cgroup
v1: ``memory.limit_in_bytes`` and ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` in the
``memory`` and ``cpu`` hierarchies. A container without its own cgroup namespace sees its
host's path in ``/proc/self/cgroup`` but its own group mounted at the top, so every level that
exists is read: a path that is not there costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TypeVar

N = TypeVar("N", int, float)

V1_NO_LIMIT = 2**62
"""cgroup v1 writes "no limit" as the largest page-aligned 64-bit number; any figure from here
up is none."""


@dataclass(frozen=True)
class CgroupLimits:
    memory_bytes: int | None = None
    cpus: float | None = None
    """CPUs' worth of time per period the quota allows (2.5 for 250 ms per 100 ms)."""


def read_limits(root: Path) -> CgroupLimits:
    """The limits of the calling process's control group, as seen under ``root``."""
    memberships = _memberships(_read(root / "proc/self/cgroup") or "")
    mount = root / "sys/fs/cgroup"
    if "" in memberships and (mount / "cgroup.controllers").exists():
        groups = _levels(mount, memberships[""])
        return CgroupLimits(
            _smallest(_bytes(_read(g / "memory.max")) for g in groups),
            _smallest(_v2_cpus(_read(g / "cpu.max")) for g in groups),
        )
    memory = _smallest(
        _bytes(_read(g / "memory.limit_in_bytes"))
        for g in _levels(mount / "memory", memberships.get("memory", "/"))
    )
    cpu_path = memberships.get("cpu", "/")
    cpus = _smallest(
        _v1_cpus(_read(g / "cpu.cfs_quota_us"), _read(g / "cpu.cfs_period_us"))
        for hierarchy in ("cpu,cpuacct", "cpu")
        for g in _levels(mount / hierarchy, cpu_path)
    )
    return CgroupLimits(memory, cpus)


def _memberships(text: str) -> dict[str, str]:
    """Controller -> group path; "" for the cgroup v2 hierarchy."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            found[controller.removeprefix("name=")] = path
    return found


def _levels(mount: Path, path: str) -> list[Path]:
    """The group at ``path`` under ``mount`` and every group above it that exists."""
    group = PurePosixPath("/") / path
    levels = [mount / str(p).lstrip("/") for p in (group, *group.parents)]
    return [level for level in levels if level.is_dir()]


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _bytes(text: str | None) -> int | None:
    value = (text or "").strip()
    if not value.isdigit():  # "max", absent, or unreadable
        return None
    number = int(value)
    return number if 0 < number < V1_NO_LIMIT else None


def _v2_cpus(text: str | None) -> float | None:
    parts = (text or "").split()
    if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit() or parts[1] == "0":
        return None  # "max 100000": no quota
    return int(parts[0]) / int(parts[1])


def _v1_cpus(quota: str | None, period: str | None) -> float | None:
    q, p = (quota or "").strip(), (period or "").strip()
    if not q.isdigit() or not p.isdigit() or p == "0":  # -1: no quota
        return None
    return int(q) / int(p)


def _smallest(values: Iterable[N | None]) -> N | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None
