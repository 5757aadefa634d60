"""A cgroup v2 per Python step worker, where the host delegates one to the agent.

The agent uses cgroup v2 only when it is plainly delegated: its own cgroup is named ``agent``
(systemd's ``DelegateSubgroup=agent``), the parent's ``cgroup.controllers`` offers ``pids`` and
``memory``, and the agent may write the parent (``Delegate=pids memory``). Each worker then
gets ``<parent>/step-<n>`` with ``pids.max`` and ``memory.max`` (the whole group's, where the
rlimits are each process's), and is killed as a whole through ``cgroup.kill``.

A host whose ``pids`` or ``memory`` controller is on cgroup v1 (a legacy or hybrid layout) is
reported as such and left alone: the agent does not manage v1 hierarchies. Anywhere else the
rlimits and namespaces of :mod:`agent.pipelines.sandbox` are the bounds.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

DELEGATED_NAME = "agent"
"""The name of the agent's own cgroup under a delegated parent (``DelegateSubgroup=``)."""
CONTROLLERS = ("pids", "memory")


class CgroupSupport(StrEnum):
    DELEGATED = "delegated"
    """cgroup v2, delegated to the agent: a cgroup per worker."""
    CGROUP_V1 = "cgroup-v1"
    """``pids`` or ``memory`` is on cgroup v1 (legacy or hybrid host): not used."""
    NOT_DELEGATED = "not-delegated"
    """cgroup v2, but no parent the agent may manage."""
    NONE = "none"
    """No cgroup v2 mounted (or not Linux)."""


@dataclass
class Cgroups:
    """What the host offers, and the workers' cgroups made under it."""

    support: CgroupSupport
    reason: str
    parent: Path | None = None
    _names: itertools.count[int] = field(default_factory=itertools.count)

    def make(self, pids_max: int, memory_max_bytes: int) -> Path | None:
        """A new cgroup for one worker, with its limits; None where none is delegated."""
        if self.parent is None:
            return None
        sweep(self.parent)
        path = self.parent / f"step-{os.getpid()}-{next(self._names)}"
        path.mkdir(mode=0o755)
        (path / "pids.max").write_text(str(pids_max))
        (path / "memory.max").write_text(str(memory_max_bytes))
        return path


def kill(path: Path) -> None:
    """Kill every process of a worker's cgroup (5.14+: ``cgroup.kill``) and remove it. One
    that is still emptying is left: the kernel removes nothing a process holds, and the next
    :func:`sweep` takes it."""
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    with contextlib.suppress(OSError):
        path.rmdir()


def sweep(parent: Path) -> None:
    """Remove the empty cgroups that earlier workers left."""
    for stale in parent.glob("step-*"):
        with contextlib.suppress(OSError):
            stale.rmdir()


def probe(proc: Path = Path("/proc")) -> Cgroups:
    """What this process's host offers (read from ``/proc/self``)."""
    try:
        mountinfo = (proc / "self/mountinfo").read_text()
        membership = (proc / "self/cgroup").read_text()
    except OSError as exc:
        return Cgroups(CgroupSupport.NONE, f"cannot read /proc: {exc}")
    found = from_proc(mountinfo, membership)
    if found.parent is not None:
        try:
            _enable(found.parent)
        except OSError as exc:
            return Cgroups(CgroupSupport.NOT_DELEGATED, f"{found.parent}: {exc}")
    return found


def from_proc(mountinfo: str, membership: str) -> Cgroups:
    """The decision from ``/proc/self/mountinfo`` and ``/proc/self/cgroup``'s text."""
    unified: Path | None = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        fstype, _, options = line.split(" - ", 1)[1].split()[:3]
        if fstype == "cgroup2":
            unified = Path(fields[4])
        elif fstype == "cgroup" and set(options.split(",")) & set(CONTROLLERS):
            return Cgroups(
                CgroupSupport.CGROUP_V1,
                "pids and memory are on cgroup v1 (a legacy or hybrid host); the agent does "
                "not manage v1 hierarchies",
            )
    if unified is None:
        return Cgroups(CgroupSupport.NONE, "no cgroup v2 mounted")
    own = next((line[3:] for line in membership.splitlines() if line.startswith("0::")), None)
    if own is None or own.strip("/") == "":
        return Cgroups(CgroupSupport.NOT_DELEGATED, "the agent is in the root cgroup")
    mine = unified / own.strip("/")
    if mine.name != DELEGATED_NAME:
        return Cgroups(
            CgroupSupport.NOT_DELEGATED,
            f"the agent's cgroup {own} is not a delegated subgroup named {DELEGATED_NAME!r}",
        )
    return Cgroups(CgroupSupport.DELEGATED, f"workers under {mine.parent}", mine.parent)


def _enable(parent: Path) -> None:
    """Check the delegation and turn the controllers on for the workers' cgroups."""
    offered = (parent / "cgroup.controllers").read_text().split()
    missing = [c for c in CONTROLLERS if c not in offered]
    if missing:
        raise OSError(f"the cgroup does not offer {' and '.join(missing)}")
    if not os.access(parent, os.W_OK):
        raise OSError("not writable by the agent's user")
    enabled = (parent / "cgroup.subtree_control").read_text().split()
    wanted = " ".join(f"+{c}" for c in CONTROLLERS if c not in enabled)
    if wanted:
        (parent / "cgroup.subtree_control").write_text(wanted)
    sweep(parent)
