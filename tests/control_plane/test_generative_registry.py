"""A generative model's folder through the registry: ``edgefleet models push`` uploads it as one
``genai`` variant, validation greedy-decodes reference prompts on every runtime here that runs
it (token for token alike), and a broken folder fails validation with the reason and cannot be
rolled out. A real control plane on SQLite and the example ``tiny-lm``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtimes.examples.tiny_lm import write_tiny_lm
from runtimes.generative_check import genai_installed
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.test_operations import edgefleet
from tests.control_plane.test_rollouts import validate, wait_devices

PAGE = Path(__file__).resolve().parents[2] / "docs" / "generative.md"


def fleet_commands() -> list[str]:
    """The shell block of the page's "Through the fleet" section, a command a line."""
    section = PAGE.read_text().split("## Through the fleet", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)
    return [line for line in block.splitlines() if line.strip()]


def lm_folder(directory: Path, seed: int | None = None) -> Path:
    directory.mkdir(parents=True)
    if seed is None:
        write_tiny_lm(directory)
    else:
        write_tiny_lm(directory, seed=seed)
    return directory


def failed_checks(report: dict[str, object]) -> dict[str, str]:
    return {c["check"]: c["detail"] for c in report["checks"] if not c["passed"]}  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_generative_folder_is_pushed_signed_and_validated_across_runtimes(
    start_control_plane: ControlPlaneFactory, tmp_path: Path
) -> None:
    folder = lm_folder(tmp_path / "lm")
    with start_control_plane() as cp:
        token = cp.token("operator")
        pushed = edgefleet(cp, token, "models", "push", "tiny-lm", "1", str(folder), "--json")
        assert pushed.returncode == 0, pushed.stderr
        doc = json.loads(pushed.stdout)
        (variant,) = doc["variants"]
        assert variant["format"] == "genai"
        assert {f["name"] for f in variant["files"]} == {
            "genai_config.json",
            "model.onnx",
            "tokenizer.json",
            "tokenizer_config.json",
        }
        assert variant["signature"]["generative"]["context_length"] == 256
        report = validate(cp.admin, "tiny-lm", 1)
        assert report["passed"], report
        names = [c["check"] for c in report["checks"]]
        assert "variant 0 (genai) decodes on onnxruntime" in names
        if genai_installed():
            agree = "variant 0 (genai) on onnxruntime-genai agrees with onnxruntime"
            (detail,) = [c["detail"] for c in report["checks"] if c["check"] == agree]
            assert detail.startswith("token for token"), detail


@pytest.mark.slow
def test_broken_generative_folders_are_refused_with_the_reason(
    start_control_plane: ControlPlaneFactory, tmp_path: Path
) -> None:
    missing = lm_folder(tmp_path / "missing")
    config = json.loads((missing / "genai_config.json").read_text())
    config["model"]["decoder"]["filename"] = "decoder.onnx"
    (missing / "genai_config.json").write_text(json.dumps(config))
    tokenizer = lm_folder(tmp_path / "tokenizer")
    (tokenizer / "tokenizer.json").write_text("{not json")
    shape = lm_folder(tmp_path / "shape")
    config = json.loads((shape / "genai_config.json").read_text())
    config["model"]["vocab_size"] = 1000  # the decoder's logits are 512 wide
    (shape / "genai_config.json").write_text(json.dumps(config))
    expected = {
        2: "names the decoder file 'decoder.onnx', which the folder does not hold",
        3: "tokenizer.json does not read",
        4: "logits have shape [1, 2, 512], expected [1, 2, 1000]",
    }
    with start_control_plane() as cp:
        token = cp.token("operator")
        for version, folder in ((2, missing), (3, tokenizer), (4, shape)):
            pushed = edgefleet(cp, token, "models", "push", "tiny-lm", str(version), str(folder))
            assert pushed.returncode == 0, pushed.stderr
            report = validate(cp.admin, "tiny-lm", version)
            assert not report["passed"]
            assert any(expected[version] in d for d in failed_checks(report).values()), report
            spec = {"model": "tiny-lm", "version": version}
            refused = cp.admin.post("/api/v1/rollouts", json=spec)
            assert refused.status_code == 409 and "failed validation" in refused.text
        shown = edgefleet(cp, token, "models", "validate", "tiny-lm", "2")
        assert shown.returncode != 0 or "decoder.onnx" in shown.stdout + shown.stderr


@pytest.mark.slow
def test_the_pages_fleet_commands_run_as_written(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    bin_dir = Path(sys.executable).parent
    with start_control_plane() as cp, start_agent("dev-a", cp) as agent:
        wait_devices(cp, "dev-a")
        env = {
            **os.environ,
            "EDGEFLEET_URL": cp.url,
            "EDGEFLEET_TOKEN": cp.token("operator"),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        for line in fleet_commands():
            run = subprocess.run(
                line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
            )
            assert run.returncode == 0, f"{line}\n{run.stdout}\n{run.stderr}"
        (rollout,) = cp.admin.get("/api/v1/rollouts").json()
        doc = cp.admin.get(f"/api/v1/rollouts/{rollout['id']}").json()
        assert doc["model"] == "tiny-lm" and doc["version"] == 1
        assert doc["gates"]["max_ttft_p99_ms"] == 500, doc
        assert doc["gates"]["max_inter_token_p99_ms"] == 100
        # wave 1's device installs the model it did not have (the gates then wait for traffic)
        wait_until(
            lambda: agent.state.generative is not None and agent.state.generative.served,
            what="dev-a to serve tiny-lm",
        )
