"""The ``edgefleet`` command, run as a user runs it: the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtimes.fake_machines import MACHINES


def edgefleet(
    *args: str, check: bool = True, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "edgefleet"
    command = [str(exe)] if exe.exists() else [shutil.which("edgefleet") or "edgefleet"]
    result = subprocess.run(command + list(args), capture_output=True, text=True, timeout=timeout_s)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_version() -> None:
    from common import __version__

    assert edgefleet("--version").stdout.strip() == f"edgefleet, version {__version__}"


def test_hardware_json_plans_every_example_model(example_repo: Path) -> None:
    report = json.loads(edgefleet("hardware", "--json", str(example_repo)).stdout)
    assert report["runtimes"]["onnxruntime"]["installed"]
    plans = {m["model"]: m for m in report["models"]}
    assert set(plans) == {"mlp", "cnn", "cnn_ir", "mlp_tflite", "classifier", "digits", "tiny-lm"}
    assert plans["cnn_ir"]["placement"]["runtime"] == "openvino"
    # a generative model is placed by the profile like any ONNX model
    assert plans["tiny-lm"]["placement"]["runtime"] == "onnxruntime"
    assert plans["mlp_tflite"]["placement"]["runtime"] == "litert"
    assert all(m["error"] is None for m in plans.values())


def test_hardware_on_a_fake_jetson_tree_explains_the_cpu_fallback(
    example_repo: Path, tmp_path: Path
) -> None:
    """The device tree is a Jetson's; the runtimes are this machine's real CPU-only builds."""
    root = MACHINES["nvidia-jetson-orin"].build(tmp_path / "jetson")
    out = edgefleet("hardware", "--root", str(root), str(example_repo)).stdout
    assert "profile:  nvidia-jetson-orin (detected)" in out
    assert (
        "skipped onnxruntime GPU: TensorrtExecutionProvider, CUDAExecutionProvider "
        "not in this onnxruntime build" in out
    )
    assert "-> onnxruntime CPU via CPUExecutionProvider [onnx]" in out


def test_pin_in_config_is_honoured_and_bad_config_reported(
    example_repo: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "mlp", repo / "mlp")
    shutil.copytree(example_repo / "mlp", repo / "broken")
    (repo / "mlp/config.toml").write_text('[placement]\nruntime = "openvino"\ndevice = "CPU"\n')
    (repo / "broken/config.toml").write_text('[placement]\nruntime = "tensorflow"\n')
    report = json.loads(edgefleet("hardware", "--json", str(repo)).stdout)
    plans = {m["model"]: m for m in report["models"]}
    assert plans["mlp"]["pinned"] and plans["mlp"]["placement"]["runtime"] == "openvino"
    assert "field placement.runtime" in plans["broken"]["error"]


def test_bad_profile_is_a_startup_error_naming_file_and_field(tmp_path: Path) -> None:
    (tmp_path / "x.toml").write_text('name = "x"\n')
    result = edgefleet("hardware", "--profiles-dir", str(tmp_path), check=False)
    assert result.returncode != 0
    assert f"{tmp_path / 'x.toml'}: field description: Field required" in result.stderr


def test_models_example_writes_then_refuses_to_overwrite(tmp_path: Path) -> None:
    edgefleet("models", "example", str(tmp_path), "--only", "mlp")
    assert (tmp_path / "mlp/1/model.onnx").is_file()
    again = edgefleet("models", "example", str(tmp_path), "--only", "mlp", check=False)
    assert again.returncode == 1 and "exists" in again.stderr


def test_will_delay_without_mqtt_5_is_a_startup_error(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        f'model_repository = "{tmp_path}"\n[fleet]\nmqtt_url = "mqtt://127.0.0.1:1"\n'
        'mqtt_protocol = "3.1.1"\nwill_delay_s = 5\n'
    )
    result = edgefleet("agent", "--config", str(config), check=False)
    assert result.returncode != 0
    assert "will_delay_s needs mqtt_protocol 5" in result.stderr


@pytest.mark.parametrize(
    ("config_text", "flags", "says"),
    [
        ("port = \n", (), "Error: invalid settings: {config}: Invalid value (at line 1"),
        (None, (), "Error: invalid settings: settings file {config} does not exist"),
        ("", ("--port", "70000"), "Error: invalid settings: port: Input should be less than"),
        ('[fleet]\nmqtt_url = "mqtt://127.0.0.1:1"\nbogus = 1\n', (), "fleet.bogus: Extra"),
    ],
)
def test_bad_settings_are_one_error_line(
    tmp_path: Path, config_text: str | None, flags: tuple[str, ...], says: str
) -> None:
    """The agent's settings file or flags, wrong: one ``Error:`` line naming the file or the
    field, exit code 1, before anything is served."""
    config = tmp_path / "agent.toml"
    if config_text is not None:
        config.write_text(config_text)
    result = edgefleet("agent", "--config", str(config), *flags, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert says.format(config=config) in result.stderr.strip().splitlines()[-1], result.stderr
