"""The README's two commands stay true: CI runs the test one verbatim."""

from __future__ import annotations

import json
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
    # local self-tests first: the classifier's JPEG end to end, tiny-lm's prompt through an
    # empty KV cache (tests/agent/test_cli.py ran the demo a second time for this once)
    assert run.stdout.count("self-test passed") == 7, run.stdout
    assert "edge-x86: v2 on onnxruntime_onnx" in run.stdout
    assert "edge-pi: v2 on litert_tflite" in run.stdout
    assert "PASS variant 0 (genai) decodes on onnxruntime: 3 reference prompts" in run.stdout
    assert any(line.startswith("edge-pi: tiny-lm v1 completes 'The fleet' with") for line in lines)
    assert any(line.startswith("rollout 3: rolled_back:") for line in lines)
    assert lines[-2:] == ["serving now: edge-x86 v2, edge-pi v2", "== done"]
    # every line the control plane and the agents wrote is one JSON object: ONNX Runtime's and
    # LiteRT's own lines and a traceback per failed request of the bad version once were not
    logs = sorted((tmp_path / "var" / "demo" / "logs").glob("*.log"))
    ours = [log for log in logs if log.name != "mosquitto.log"]
    assert {log.stem for log in ours} == {"control-plane", "edge-x86", "edge-pi"}
    for log in ours:
        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        assert records, log
        assert not [r for r in records if "exc_info" in r or "Traceback" in str(r)], log


def test_the_readme_openai_call_works_against_the_agent(tmp_path: Path) -> None:
    """The README's ``openai`` line, run as it is against ``edgefleet agent`` serving the
    examples' ``tiny-lm`` (on a free port: only the address is changed)."""
    from tests.agent.process import agent_process
    from tests.agent.server import wait_until

    lines = (ROOT / "README.md").read_text().splitlines()
    (call,) = [
        line.strip() for line in lines if line.startswith('    .venv/bin/python -c "from openai')
    ]
    exe = Path(sys.executable).parent / "edgefleet"
    written = subprocess.run(
        [str(exe), "models", "example", str(tmp_path / "models"), "--only", "tiny-lm"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert written.returncode == 0, written.stderr
    with agent_process("--model-repository", str(tmp_path / "models"), "--port", "0") as agent:
        import httpx

        wait_until(
            lambda: httpx.get(f"{agent.address}/v2/health/ready").status_code == 200, what="ready"
        )
        command = call.replace("http://localhost:8000", agent.address)
        command = command.replace(".venv/bin/python", sys.executable, 1)
        run = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    text = run.stdout.rstrip("\n")
    assert text and text.isprintable()
