"""The README's two commands stay true: CI runs the test one verbatim."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line.strip() for line in lines if line.startswith("    python3 -m venv")]


def test_readme_has_a_demo_command_and_a_test_command() -> None:
    demo, test = _commands()[:2]
    assert demo.endswith("edgefleet demo")
    assert test.endswith("python -m pytest -n 2")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    test = _commands()[1]
    assert test in (ROOT / ".ci/run").read_text().splitlines()


@pytest.mark.slow
def test_the_demo_command_runs_its_story(tmp_path: Path) -> None:
    """The README's demo, as a user runs it: from a fresh working directory (its state goes
    under the relative ``var/demo``), to the rollback of the bad version. A relative artifact
    directory once made every upload fail here while the rest of the suite passed."""
    exe = Path(sys.executable).parent / "edgefleet"
    run = subprocess.run(
        [str(exe), "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert "edge-x86: v2 on onnxruntime_onnx" in run.stdout
    assert "edge-pi: v2 on litert_tflite" in run.stdout
    assert any(line.startswith("rollout 2: rolled_back:") for line in lines)
    assert lines[-2:] == ["serving now: edge-x86 v2, edge-pi v2", "== done"]
