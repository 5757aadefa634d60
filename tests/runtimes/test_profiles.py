"""Hardware profile files: the shipped ones load, bad ones fail naming the file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimes.errors import ProfileError
from runtimes.formats import ModelFormat
from runtimes.hardware.detect import detect_profile
from runtimes.hardware.probe import probe_machine
from runtimes.hardware.profile import default_profiles_dir, load_profile, load_profiles
from tests.runtimes.fake_machines import MACHINES

GOOD = """
name = "board"
description = "a board"
[match]
architectures = ["x86_64"]
[[preferences.onnx]]
runtime = "onnxruntime"
providers = ["CPUExecutionProvider"]
"""


def _write(tmp_path: Path, text: str, name: str = "board.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_profiles_load_and_order_npu_gpu_before_cpu() -> None:
    profiles = load_profiles(default_profiles_dir())
    assert len(profiles) >= 6
    rank = {"NPU": 0, "EdgeTPU": 0, "GPU": 1, "CPU": 2}
    for profile in profiles:
        for fmt, candidates in profile.preferences.items():
            ranks = [rank[c.device] for c in candidates]
            assert ranks == sorted(ranks), f"{profile.name} {fmt}: {[c.device for c in candidates]}"
            assert candidates[-1].device == "CPU", f"{profile.name} {fmt} has no CPU fallback"


def test_good_profile_loads(tmp_path: Path) -> None:
    profile = load_profile(_write(tmp_path, GOOD))
    assert profile.preferences[ModelFormat.ONNX][0].providers == ("CPUExecutionProvider",)


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        (GOOD.replace('description = "a board"\n', ""), "description", "Field required"),
        (
            GOOD.replace('runtime = "onnxruntime"', 'runtime = "tensorflow"'),
            "preferences.onnx.0.runtime",
            "Input should be",
        ),
        (GOOD.replace("[match]", "[match]\ncpu_modle = ['x']"), "match.cpu_modle", "Extra inputs"),
        (
            GOOD.replace("preferences.onnx", "preferences.caffe"),
            "preferences.caffe",
            "Input should be",
        ),
        (
            GOOD.replace('providers = ["CPUExecutionProvider"]', ""),
            "preferences.onnx.0",
            "lists its execution providers",
        ),
        (
            GOOD.replace(
                'runtime = "onnxruntime"\nproviders = ["CPUExecutionProvider"]',
                'runtime = "litert"',
            ),
            "preferences.onnx.0.runtime",
            "litert cannot run onnx",
        ),
        (
            GOOD + '[[preferences.tflite]]\nruntime = "litert"\n'
            '[[preferences.tflite]]\nruntime = "onnxruntime"\nproviders = ["CPUExecutionProvider"]\n',
            "preferences.tflite.1.runtime",
            "onnxruntime cannot run tflite models",
        ),
        (
            GOOD.replace(
                'providers = ["CPUExecutionProvider"]',
                'providers = ["CUDAExecutionProvidr", "CPUExecutionProvider"]\n'
                'provider_options.CUDAExecutionProvider = { device_id = "0" }',
            ),
            "preferences.onnx.0.provider_options.CUDAExecutionProvider",
            "CUDAExecutionProvider is not in providers (CUDAExecutionProvidr, CPUExecutionProvider)",
        ),
        (GOOD.replace('name = "board"', 'name = "Bad Name"'), "name", "should match pattern"),
        (
            "memory_budget_fraction = 1.5\n" + GOOD,
            "memory_budget_fraction",
            "less than or equal to 1",
        ),
    ],
)
def test_bad_profile_names_file_and_field(
    tmp_path: Path, text: str, field: str, message: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert str(info.value).startswith(f"{path}: field {field}: "), str(info.value)
    assert message in str(info.value)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "name = ")
    with pytest.raises(ProfileError, match=f"{path}: invalid TOML"):
        load_profile(path)


def test_duplicate_profile_names_are_refused(tmp_path: Path) -> None:
    _write(tmp_path, GOOD, "a.toml")
    _write(tmp_path, GOOD, "b.toml")
    with pytest.raises(ProfileError, match="b.toml: field name: 'board' is also used by .*a.toml"):
        load_profiles(tmp_path)


def test_two_profiles_matching_at_the_same_priority_is_an_error(tmp_path: Path) -> None:
    _write(tmp_path, GOOD, "a.toml")
    _write(tmp_path, GOOD.replace('name = "board"', 'name = "other"'), "b.toml")
    facts = probe_machine(MACHINES["generic-x86_64"].build(tmp_path / "root"))
    with pytest.raises(ProfileError, match="board and other both match with priority 0"):
        detect_profile(load_profiles(tmp_path), facts)


def test_empty_profiles_dir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no hardware profiles"):
        load_profiles(tmp_path)
