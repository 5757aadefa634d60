"""Fake device trees (the hardware seam) and runtime inventories for hardware that cannot run
here: NPUs, GPUs, EdgeTPUs. Each builder writes /proc, /sys, /dev and /etc files under a root."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from runtimes.inventory import RuntimeInfo, RuntimeInventory

CPU_ONLY_ORT = frozenset({"CPUExecutionProvider"})


@dataclass
class FakeMachine:
    architecture: str
    cpu_model: str = "Generic CPU"
    device_tree_model: str | None = None
    files: tuple[str, ...] = ()
    usb: tuple[str, ...] = ()
    cpus: int = 4
    memory_kib: int = 8 * 1024 * 1024
    extra: dict[str, str] = field(default_factory=dict)

    def build(self, root: Path) -> Path:
        proc = root / "proc"
        (proc / "sys/kernel").mkdir(parents=True)
        (proc / "sys/kernel/arch").write_text(self.architecture + "\n")
        key = "model name" if self.architecture == "x86_64" else "Model"
        cpuinfo = "".join(
            f"processor\t: {i}\n{key}\t: {self.cpu_model}\n\n" for i in range(self.cpus)
        )
        (proc / "cpuinfo").write_text(cpuinfo)
        (proc / "meminfo").write_text(f"MemTotal:       {self.memory_kib} kB\nMemFree: 1 kB\n")
        if self.device_tree_model is not None:
            (proc / "device-tree").mkdir()
            (proc / "device-tree/model").write_text(self.device_tree_model + "\x00")
        for path in self.files:
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(self.extra.get(path, ""))
        for i, usb_id in enumerate(self.usb):
            vendor, product = usb_id.split(":")
            dev = root / f"sys/bus/usb/devices/1-{i + 1}"
            dev.mkdir(parents=True)
            (dev / "idVendor").write_text(vendor + "\n")
            (dev / "idProduct").write_text(product + "\n")
        return root


def inventory(
    *,
    ort: frozenset[str] | None = CPU_ONLY_ORT,
    openvino: frozenset[str] | None = frozenset({"CPU"}),
    litert: bool = True,
    delegates: frozenset[str] = frozenset(),
) -> RuntimeInventory:
    """A runtime inventory as a device with these libraries would report it (None: absent)."""

    def info(name: str, devices: frozenset[str] | None) -> RuntimeInfo:
        if devices is None:
            return RuntimeInfo(name, None, missing_reason="not installed")
        return RuntimeInfo(name, "fake", devices)

    return RuntimeInventory(
        runtimes={
            "onnxruntime": info("onnxruntime", ort),
            "openvino": info("openvino", openvino),
            "litert": info("litert", frozenset({"CPU"}) if litert else None),
        },
        delegate_libraries=delegates,
    )


MACHINES: dict[str, FakeMachine] = {
    "generic-x86_64": FakeMachine("x86_64", "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz"),
    "generic-arm64": FakeMachine("aarch64", "Ampere Altra", device_tree_model=None),
    "intel-core-ultra": FakeMachine(
        "x86_64",
        "Intel(R) Core(TM) Ultra 7 155H",
        files=("/dev/accel/accel0", "/dev/dri/renderD128", "/dev/dri/card0"),
    ),
    "nvidia-jetson-orin": FakeMachine(
        "aarch64",
        "ARMv8 Processor rev 1 (v8l)",
        device_tree_model="NVIDIA Jetson AGX Orin Developer Kit",
        files=("/etc/nv_tegra_release", "/dev/nvhost-ctrl-gpu", "/dev/nvhost-gpu"),
    ),
    "raspberry-pi-5": FakeMachine(
        "aarch64",
        "Raspberry Pi 5 Model B Rev 1.0",
        device_tree_model="Raspberry Pi 5 Model B Rev 1.0",
    ),
    "google-coral": FakeMachine("x86_64", "Intel(R) Celeron(R) N5105", usb=("1a6e:089a",)),
    "qualcomm-qnn": FakeMachine(
        "aarch64",
        "Qualcomm Kryo",
        device_tree_model="Qualcomm Technologies, Inc. QCS6490 RB3gen2",
        files=("/dev/fastrpc-cdsp", "/dev/fastrpc-adsp"),
    ),
    "nvidia-gpu": FakeMachine(
        "x86_64", "AMD EPYC 7763 64-Core Processor", files=("/dev/nvidiactl", "/dev/nvidia0")
    ),
}
