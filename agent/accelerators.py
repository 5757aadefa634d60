"""Accelerator utilisation where the platform exposes it; absent otherwise, never made up.

Read through the same root seam as hardware detection, so tests use a fake sysfs.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
import time
from pathlib import Path

_JETSON_LOAD = (
    "sys/devices/gpu.0/load",
    "sys/devices/platform/gpu.0/load",
    "sys/devices/platform/17000000.ga10b/load",
    "sys/devices/platform/bus@0/17000000.gpu/load",
)
_CACHE_S = 5.0


class AcceleratorProbe:
    """Utilisation ratios (0..1) per device name, cached for a few seconds."""

    def __init__(self, root: Path = Path("/"), *, cache_s: float = _CACHE_S) -> None:
        self.root = root
        self.cache_s = cache_s
        self._npu_last: dict[str, tuple[float, int]] = {}
        self._cached: tuple[float, dict[str, float]] | None = None
        self._nvidia_smi = shutil.which("nvidia-smi") if root == Path("/") else None

    def utilisation(self) -> dict[str, float]:
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < self.cache_s:
            return self._cached[1]
        found: dict[str, float] = {}
        found |= self._jetson()
        found |= self._intel_npu(now)
        found |= self._nvidia()
        self._cached = (now, found)
        return found

    def _read(self, relative: str) -> str | None:
        try:
            return (self.root / relative).read_text().strip()
        except OSError:
            return None

    def _jetson(self) -> dict[str, float]:
        for path in _JETSON_LOAD:
            value = self._read(path)
            if value and value.isdigit():
                return {"jetson_gpu": int(value) / 1000.0}  # the driver reports per mille
        return {}

    def _intel_npu(self, now: float) -> dict[str, float]:
        found = {}
        for path in sorted(
            glob.glob(str(self.root / "sys/class/accel/accel*/device/npu_busy_time_us"))
        ):
            device = Path(path).parts[-3]
            try:
                busy_us = int(Path(path).read_text().strip())
            except (OSError, ValueError):
                continue
            last = self._npu_last.get(device)
            self._npu_last[device] = (now, busy_us)
            if last is not None and now > last[0]:
                ratio = (busy_us - last[1]) / 1e6 / (now - last[0])
                found[f"intel_npu_{device}"] = min(max(ratio, 0.0), 1.0)
        return found

    def _nvidia(self) -> dict[str, float]:
        if self._nvidia_smi is None:
            return {}
        try:
            out = subprocess.run(
                [
                    self._nvidia_smi,
                    "--query-gpu=index,utilization.gpu",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
                timeout=2,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
        found = {}
        for line in out.splitlines():
            index, _, util = line.partition(",")
            if util.strip().isdigit():
                found[f"nvidia_gpu{index.strip()}"] = int(util) / 100.0
        return found
