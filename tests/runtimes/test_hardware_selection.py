"""Detection and placement for every shipped profile, on fake device trees.

The device tree is the one hardware seam; the runtime inventory stands in for accelerator
builds of onnxruntime/OpenVINO/LiteRT that cannot be installed here. Tests that use a fake
inventory say "fake_inventory" in their names.
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from runtimes.errors import NoPlacementError, ProfileError
from runtimes.formats import ModelFormat
from runtimes.hardware.context import HardwareContext
from runtimes.hardware.probe import ACCELERATOR_NODES, probe_machine
from runtimes.hardware.profile import default_profiles_dir, load_profiles
from runtimes.hardware.select import Pin
from tests.runtimes.fake_machines import MACHINES, inventory

ONNX, IR, TFLITE = ModelFormat.ONNX, ModelFormat.OPENVINO_IR, ModelFormat.TFLITE
NVIDIA_ORT = frozenset(
    {"TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"}
)

# profile -> (inventory as that device's runtimes would report,
#             {format: (runtime, device, providers, delegate)})
EXPECTED = {
    "generic-x86_64": (
        inventory(),
        {
            ONNX: ("onnxruntime", "CPU", ("CPUExecutionProvider",), None),
            IR: ("openvino", "CPU", (), None),
            TFLITE: ("litert", "CPU", (), None),
        },
    ),
    "generic-arm64": (
        inventory(openvino=None),
        {
            ONNX: ("onnxruntime", "CPU", ("CPUExecutionProvider",), None),
            TFLITE: ("litert", "CPU", (), None),
        },
    ),
    "intel-core-ultra": (
        inventory(openvino=frozenset({"CPU", "GPU", "NPU"})),
        {
            ONNX: ("openvino", "NPU", (), None),
            IR: ("openvino", "NPU", (), None),
            TFLITE: ("openvino", "NPU", (), None),
        },
    ),
    "nvidia-jetson-orin": (
        inventory(
            ort=NVIDIA_ORT,
            openvino=None,
            delegates=frozenset({"libtensorflowlite_gpu_delegate.so"}),
        ),
        {
            ONNX: (
                "onnxruntime",
                "GPU",
                ("TensorrtExecutionProvider", "CUDAExecutionProvider"),
                None,
            ),
            TFLITE: ("litert", "GPU", (), "libtensorflowlite_gpu_delegate.so"),
        },
    ),
    "raspberry-pi-5": (
        inventory(),
        {
            TFLITE: ("litert", "CPU", (), None),
            ONNX: ("onnxruntime", "CPU", ("CPUExecutionProvider",), None),
            IR: ("openvino", "CPU", (), None),
        },
    ),
    "google-coral": (
        inventory(delegates=frozenset({"libedgetpu.so.1"})),
        {
            TFLITE: ("litert", "EdgeTPU", (), "libedgetpu.so.1"),
            ONNX: ("onnxruntime", "CPU", ("CPUExecutionProvider",), None),
        },
    ),
    "qualcomm-qnn": (
        inventory(ort=frozenset({"QNNExecutionProvider", "CPUExecutionProvider"}), openvino=None),
        {
            ONNX: ("onnxruntime", "NPU", ("QNNExecutionProvider",), None),
            TFLITE: ("litert", "CPU", (), None),
        },
    ),
    "nvidia-gpu": (
        inventory(ort=frozenset({"CUDAExecutionProvider", "CPUExecutionProvider"})),
        {
            ONNX: ("onnxruntime", "GPU", ("CUDAExecutionProvider",), None),
            IR: ("openvino", "CPU", (), None),
        },
    ),
}


def _context(tmp_path: Path, machine: str, inv=None, **kw) -> HardwareContext:  # type: ignore[no-untyped-def]
    root = MACHINES[machine].build(tmp_path / machine)
    return HardwareContext.detect(root=root, inventory=inv or EXPECTED[machine][0], **kw)


def test_every_shipped_profile_has_a_fake_machine_and_an_expected_plan() -> None:
    names = {p.name for p in load_profiles(default_profiles_dir())}
    assert names == set(MACHINES) == set(EXPECTED)


@pytest.mark.parametrize("machine", sorted(EXPECTED))
def test_fake_tree_selects_its_profile_and_plan_with_fake_inventory(
    machine: str, tmp_path: Path
) -> None:
    ctx = _context(tmp_path, machine)
    assert ctx.profile.name == machine
    for fmt, (runtime, device, providers, delegate) in EXPECTED[machine][1].items():
        placement = ctx.plan("m", fmt).placement
        assert (placement.runtime, placement.device, placement.providers, placement.delegate) == (
            runtime,
            device,
            providers,
            delegate,
        ), fmt


def test_intel_npu_missing_device_node_falls_back_to_gpu_with_fake_inventory(
    tmp_path: Path,
) -> None:
    machine = MACHINES["intel-core-ultra"]
    machine_without_npu = type(machine)(
        machine.architecture, machine.cpu_model, files=("/dev/dri/renderD128",)
    )
    root = machine_without_npu.build(tmp_path / "nuc")
    ctx = HardwareContext.detect(
        root=root, inventory=inventory(openvino=frozenset({"CPU", "GPU", "NPU"}))
    )
    assert ctx.profile.name == "intel-core-ultra"
    plan = ctx.plan("m", ONNX)
    assert (plan.placement.runtime, plan.placement.device) == ("openvino", "GPU")
    assert [str(s) for s in plan.skipped] == [
        "openvino NPU: no /dev/accel/accel*",
        "onnxruntime NPU: no /dev/accel/accel*",
    ]


def test_intel_without_openvino_falls_back_to_onnxruntime_cpu_with_fake_inventory(
    tmp_path: Path,
) -> None:
    ctx = _context(tmp_path, "intel-core-ultra", inventory(openvino=None))
    plan = ctx.plan("m", ONNX)
    assert plan.placement.describe() == "onnxruntime CPU via CPUExecutionProvider"
    reasons = [str(s) for s in plan.skipped]
    assert reasons[0] == "openvino NPU: openvino is not installed"
    assert reasons[1].startswith(
        "onnxruntime NPU: OpenVINOExecutionProvider not in this onnxruntime build"
    )
    assert reasons[2] == "openvino GPU: openvino is not installed"


def test_openvino_that_reports_no_npu_is_skipped_with_fake_inventory(tmp_path: Path) -> None:
    ctx = _context(tmp_path, "intel-core-ultra", inventory(openvino=frozenset({"CPU", "GPU"})))
    plan = ctx.plan("m", IR)
    assert plan.placement.device == "GPU"
    assert str(plan.skipped[0]) == "openvino NPU: OpenVINO reports no NPU device (it has CPU, GPU)"


def test_numbered_gpus_count_as_the_gpu_with_fake_inventory(tmp_path: Path) -> None:
    """OpenVINO lists GPU.0 and GPU.1 when there are two (an iGPU and an Arc card)."""
    ctx = _context(
        tmp_path, "intel-core-ultra", inventory(openvino=frozenset({"CPU", "GPU.0", "GPU.1"}))
    )
    plan = ctx.plan("m", IR)
    assert (plan.placement.runtime, plan.placement.device) == ("openvino", "GPU")
    assert [str(s) for s in plan.skipped] == [
        "openvino NPU: OpenVINO reports no NPU device (it has CPU, GPU.0, GPU.1)"
    ]


@pytest.mark.parametrize(
    ("device", "devices", "missing"),
    [
        ("GPU", {"CPU", "GPU.0", "GPU.1"}, None),
        ("GPU.1", {"CPU", "GPU.0", "GPU.1"}, None),
        ("GPU.2", {"CPU", "GPU.0", "GPU.1"}, "GPU.2"),
        ("GPU.0", {"CPU", "GPU"}, None),
        ("GPU.1", {"CPU", "GPU"}, "GPU.1"),
        ("NPU", {"CPU", "GPU"}, "NPU"),
        ("AUTO", {"CPU"}, None),
        ("AUTO:NPU,CPU", {"CPU"}, None),
        ("AUTO:GPU,-CPU", {"CPU", "GPU.0"}, None),
        ("MULTI:GPU,CPU", {"CPU"}, None),
        ("AUTO:NPU,GPU", {"CPU"}, "NPU or GPU"),
        ("HETERO:NPU,CPU", {"CPU"}, "NPU"),
        ("HETERO:GPU,CPU", {"CPU", "GPU.0"}, None),
    ],
)
def test_openvino_device_strings_against_reported_devices_with_fake_inventory(
    device: str, devices: set[str], missing: str | None, tmp_path: Path
) -> None:
    """AUTO and MULTI need one of their devices, HETERO and a plain device all of theirs."""
    ctx = _context(tmp_path, "generic-x86_64", inventory(openvino=frozenset(devices)))
    pin = Pin(runtime="openvino", device=device)
    if missing is None:
        assert ctx.plan("m", IR, pin).placement.device == device
    else:
        with pytest.raises(NoPlacementError, match=f"OpenVINO reports no {missing} device"):
            ctx.plan("m", IR, pin)


def test_jetson_with_cpu_only_onnxruntime_falls_back_to_cpu_with_fake_inventory(
    tmp_path: Path,
) -> None:
    ctx = _context(tmp_path, "nvidia-jetson-orin", inventory(openvino=None))
    plan = ctx.plan("m", ONNX)
    assert plan.placement.providers == ("CPUExecutionProvider",)
    assert str(plan.skipped[0]) == (
        "onnxruntime GPU: TensorrtExecutionProvider, CUDAExecutionProvider not in this onnxruntime "
        "build (it has CPUExecutionProvider)"
    )
    tflite = ctx.plan("m", TFLITE)
    assert tflite.placement.device == "CPU"
    assert (
        str(tflite.skipped[0])
        == "litert GPU: delegate library libtensorflowlite_gpu_delegate.so does not load"
    )


def test_jetson_onnxruntime_with_cuda_only_keeps_cuda_with_fake_inventory(tmp_path: Path) -> None:
    ort = frozenset({"CUDAExecutionProvider", "CPUExecutionProvider"})
    ctx = _context(tmp_path, "nvidia-jetson-orin", inventory(ort=ort, openvino=None))
    assert ctx.plan("m", ONNX).placement.providers == ("CUDAExecutionProvider",)


def test_coral_without_libedgetpu_runs_tflite_on_cpu_with_fake_inventory(tmp_path: Path) -> None:
    ctx = _context(tmp_path, "google-coral", inventory())
    plan = ctx.plan("m", TFLITE)
    assert plan.placement.device == "CPU"
    assert str(plan.skipped[0]) == "litert EdgeTPU: delegate library libedgetpu.so.1 does not load"


def test_coral_pcie_on_arm_is_detected(tmp_path: Path) -> None:
    from tests.runtimes.fake_machines import FakeMachine

    root = FakeMachine(
        "aarch64",
        "NXP i.MX 8M",
        device_tree_model="Freescale i.MX8MQ Phanbell",
        files=("/dev/apex_0",),
    ).build(tmp_path / "devboard")
    ctx = HardwareContext.detect(
        root=root, inventory=inventory(delegates=frozenset({"libedgetpu.so.1"}))
    )
    assert ctx.profile.name == "google-coral"
    assert ctx.plan("m", TFLITE).placement.device == "EdgeTPU"


def test_no_candidate_fits_names_everything_tried_with_fake_inventory(tmp_path: Path) -> None:
    ctx = _context(tmp_path, "raspberry-pi-5", inventory(litert=False, openvino=None))
    with pytest.raises(NoPlacementError) as info:
        ctx.plan("detector", TFLITE)
    assert str(info.value) == (
        "no runtime of profile raspberry-pi-5 can run model 'detector' (tflite): "
        "litert EdgeTPU: litert is not installed; litert CPU: litert is not installed"
    )
    with pytest.raises(NoPlacementError, match="openvino CPU: openvino is not installed"):
        ctx.plan("detector", IR)


def test_raspberry_pi_5_with_a_coral_usb_accelerator_uses_the_edgetpu_with_fake_inventory(
    tmp_path: Path,
) -> None:
    """The Pi 5's profile outranks google-coral's, so it names the EdgeTPU itself."""
    from tests.runtimes.fake_machines import FakeMachine

    pi = MACHINES["raspberry-pi-5"]
    root = FakeMachine(
        pi.architecture, pi.cpu_model, device_tree_model=pi.device_tree_model, usb=("1a6e:089a",)
    ).build(tmp_path / "pi-coral")
    ctx = HardwareContext.detect(
        root=root, inventory=inventory(delegates=frozenset({"libedgetpu.so.1"}))
    )
    assert ctx.profile.name == "raspberry-pi-5"
    placement = ctx.plan("m", TFLITE).placement
    assert (placement.device, placement.delegate) == ("EdgeTPU", "libedgetpu.so.1")
    assert ctx.plan("m", IR).placement.describe() == "openvino CPU"


def test_pin_chooses_the_runtime_and_keeps_profile_options_with_fake_inventory(
    tmp_path: Path,
) -> None:
    ctx = _context(tmp_path, "intel-core-ultra")
    plan = ctx.plan("m", ONNX, Pin(runtime="onnxruntime", device="CPU"))
    assert plan.pinned and plan.placement.describe() == "onnxruntime CPU via CPUExecutionProvider"
    plan = ctx.plan("m", ONNX, Pin(runtime="openvino"))
    assert plan.placement.device == "NPU"  # first openvino candidate of the profile


def test_pin_that_cannot_be_used_is_an_error_not_a_fallback_with_fake_inventory(
    tmp_path: Path,
) -> None:
    ctx = _context(tmp_path, "generic-x86_64")
    with pytest.raises(
        NoPlacementError,
        match="pinned to openvino NPU, which cannot be used: OpenVINO reports no NPU",
    ):
        ctx.plan("m", ONNX, Pin(runtime="openvino", device="NPU"))
    with pytest.raises(NoPlacementError, match="litert cannot run onnx models"):
        ctx.plan("m", ONNX, Pin(runtime="litert"))


def test_named_profile_overrides_detection(tmp_path: Path) -> None:
    ctx = _context(tmp_path, "generic-x86_64", profile="raspberry-pi-5")
    assert ctx.profile.name == "raspberry-pi-5" and ctx.forced
    with pytest.raises(ProfileError, match="no hardware profile named 'pi-6'"):
        _context(tmp_path / "again", "generic-x86_64", profile="pi-6")


def test_unknown_machine_is_a_clear_error(tmp_path: Path) -> None:
    from tests.runtimes.fake_machines import FakeMachine

    root = FakeMachine("riscv64", "SiFive U74").build(tmp_path / "riscv")
    with pytest.raises(ProfileError, match=r"no hardware profile matches this machine \(.*riscv64"):
        HardwareContext.detect(root=root, inventory=inventory())


def test_memory_budget_is_the_smaller_of_fraction_and_cap(tmp_path: Path) -> None:
    ctx = _context(tmp_path, "raspberry-pi-5")
    assert ctx.memory_budget_bytes == 8 * 2**30 // 2  # 0.5 of 8 GiB
    capped = ctx.profile.model_copy(update={"memory_budget_mb": 1024})
    assert capped.memory_budget_bytes(8 * 2**30) == 2**30


def test_accelerators_under_the_real_root_are_absolute_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # /dev/null stands in for an accelerator node: every Linux machine has one.
    monkeypatch.setitem(ACCELERATOR_NODES, "stand-in", "/dev/nul[l]")
    assert probe_machine(Path("/")).accelerators()["stand-in"] == ["/dev/null"]


def test_this_machine_is_detected_for_real() -> None:
    """No fake tree and no fake inventory: the real machine and the installed runtimes."""
    if platform.machine() != "x86_64":
        pytest.skip("the CI machines are x86-64")
    ctx = HardwareContext.detect()
    accelerators = ctx.facts.accelerators()
    if accelerators:
        pytest.skip(f"this machine has accelerators: {accelerators}")
    assert ctx.profile.name == "generic-x86_64"
    assert ctx.inventory.get("onnxruntime").installed and ctx.inventory.get("litert").installed
    assert ctx.plan("m", ONNX).placement.runtime == "onnxruntime"
    assert ctx.plan("m", TFLITE).placement.runtime == "litert"
