"""Facts about the machine, read through one seam: a root path for /proc, /sys, /dev, /etc.

Tests point the root at a fake tree built for each profile; on a device it is ``/``.
"""

from __future__ import annotations

import glob
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from runtimes.hardware.cgroup import read_limits

ACCELERATOR_NODES = {
    "Intel NPU": "/dev/accel/accel*",
    "GPU render node (Intel/AMD/Mali)": "/dev/dri/renderD*",
    "NVIDIA GPU": "/dev/nvidia[0-9]*",
    "NVIDIA Tegra GPU": "/dev/nvhost-ctrl-gpu",
    "NVIDIA Tegra GPU (JetPack 6)": "/dev/nvgpu/igpu0/ctrl",
    "Google Coral PCIe EdgeTPU": "/dev/apex_*",
    "Qualcomm Hexagon DSP": "/dev/fastrpc-*",
}
CORAL_USB_IDS = ("1a6e:089a", "18d1:9302")


@dataclass(frozen=True)
class MachineFacts:
    root: Path
    architecture: str
    cpu_model: str
    cpu_count: int
    device_tree_model: str | None
    memory_total_bytes: int | None
    usb_ids: frozenset[str] = field(default_factory=frozenset)
    memory_limit_bytes: int | None = None
    """The control group's memory limit (a container's), if it has one
    (:mod:`runtimes.hardware.cgroup`)."""
    cpu_quota: float | None = None
    """CPUs' worth of time the control group's quota allows, if it has one."""
    affinity_cpus: int | None = None
    """CPUs this process may run on (a cpuset), read for the real root only."""

    @property
    def usable_memory_bytes(self) -> int | None:
        """Physical memory, or the control group's limit where that is lower."""
        known = [m for m in (self.memory_total_bytes, self.memory_limit_bytes) if m]
        return min(known) if known else None

    @property
    def usable_cpus(self) -> int:
        """CPUs the agent can keep busy: the processors, the cpuset's and the quota's (rounded
        up: a quota of 1.5 CPUs keeps two threads busy three quarters of the time), whichever
        is fewest; at least one."""
        limits = [n for n in (self.cpu_count, self.affinity_cpus) if n]
        if self.cpu_quota:
            limits.append(math.ceil(self.cpu_quota))
        return max(1, min(limits)) if limits else 1

    def present(self, token: str) -> bool:
        """Whether a path (glob) under the root, or ``usb:VVVV:PPPP``, exists."""
        if token.startswith("usb:"):
            return token[4:].lower() in self.usb_ids
        return bool(glob.glob(str(self.root) + "/" + token.lstrip("/")))

    def accelerators(self) -> dict[str, list[str]]:
        """Known accelerator device nodes found, by kind, as absolute device paths."""
        found: dict[str, list[str]] = {}
        # The real root "/" is the empty prefix: "/" + "/dev/..." would report //dev/...
        root = str(self.root).rstrip("/")
        for kind, pattern in ACCELERATOR_NODES.items():
            paths = sorted(glob.glob(root + pattern))
            if paths:
                found[kind] = [p[len(root) :] for p in paths]
        coral = sorted(self.usb_ids & set(CORAL_USB_IDS))
        if coral:
            found["Google Coral USB EdgeTPU"] = [f"usb:{i}" for i in coral]
        return found


def probe_machine(root: Path = Path("/")) -> MachineFacts:
    cpuinfo = _read(root / "proc/cpuinfo") or ""
    dt_model = _read(root / "proc/device-tree/model")
    meminfo = _read(root / "proc/meminfo") or ""
    limits = read_limits(root)
    affinity = (
        len(os.sched_getaffinity(0))
        if root == Path("/") and hasattr(os, "sched_getaffinity")
        else None
    )
    return MachineFacts(
        root=root,
        architecture=_architecture(root),
        cpu_model=_cpu_model(cpuinfo),
        cpu_count=sum(1 for line in cpuinfo.splitlines() if line.startswith("processor")),
        device_tree_model=dt_model.strip("\x00\n ") if dt_model else None,
        memory_total_bytes=_mem_total(meminfo),
        usb_ids=_usb_ids(root),
        memory_limit_bytes=limits.memory_bytes,
        cpu_quota=limits.cpus,
        affinity_cpus=affinity,
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _architecture(root: Path) -> str:
    arch = _read(root / "proc/sys/kernel/arch")
    if arch:
        return arch.strip()
    # Older kernels lack /proc/sys/kernel/arch; only the real root may ask uname.
    return platform.machine() if root == Path("/") else "unknown"


def _cpu_model(cpuinfo: str) -> str:
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    # x86 names the model; Arm boards name the board ("Model") or the SoC ("Hardware").
    for key in ("model name", "model", "hardware", "cpu model"):
        if fields.get(key):
            return fields[key]
    return "unknown"


def _mem_total(meminfo: str) -> int | None:
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def _usb_ids(root: Path) -> frozenset[str]:
    ids = set()
    for device in (root / "sys/bus/usb/devices").glob("*"):
        vendor, product = _read(device / "idVendor"), _read(device / "idProduct")
        if vendor and product:
            ids.add(f"{vendor.strip().lower()}:{product.strip().lower()}")
    return frozenset(ids)
