"""Accelerator utilisation read from a fake sysfs (the hardware root seam): present where the
platform exposes it, absent otherwise."""

from __future__ import annotations

from pathlib import Path

from agent.accelerators import AcceleratorProbe


def test_jetson_gpu_load_is_per_mille(tmp_path: Path) -> None:
    load = tmp_path / "sys/devices/platform/gpu.0/load"
    load.parent.mkdir(parents=True)
    load.write_text("437\n")
    assert AcceleratorProbe(tmp_path).utilisation() == {"jetson_gpu": 0.437}


def test_intel_npu_busy_time_becomes_a_ratio_between_reads(tmp_path: Path) -> None:
    busy = tmp_path / "sys/class/accel/accel0/device/npu_busy_time_us"
    busy.parent.mkdir(parents=True)
    busy.write_text("1000000\n")
    probe = AcceleratorProbe(tmp_path, cache_s=0)
    assert probe.utilisation() == {}  # one reading is no rate yet
    busy.write_text("99000000000\n")  # far more busy time than wall time: clamped
    assert probe.utilisation() == {"intel_npu_accel0": 1.0}


def test_nothing_is_reported_without_accelerators(tmp_path: Path) -> None:
    assert AcceleratorProbe(tmp_path).utilisation() == {}
