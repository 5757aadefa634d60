"""The agent as a process: `edgefleet agent`, SIGTERM with requests in flight, a Unix socket,
settings from a file, the environment and flags."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from agent.settings import load_settings
from runtimes.golden import GoldenSample
from tests.agent.process import agent_process
from tests.agent.server import copy_models, wait_until


def _ready(url: str, transport: httpx.HTTPTransport | None = None) -> bool:
    try:
        with httpx.Client(transport=transport) as client:
            return client.get(f"{url}/v2/health/ready").status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_sigterm_finishes_in_flight_requests_and_exits_0(
    example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(
        example_repo, tmp_path / "repo", "cnn", configs={"cnn": "[batching]\nmax_batch_size = 4\n"}
    )
    golden = GoldenSample.load(repo / "cnn/1/golden.npz")
    x = np.concatenate([golden.inputs["input"]] * 12)  # 24 rows: six batches per request
    raw = x.astype("<f4").tobytes()
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "logits", "parameters": {"binary_data": False}}],
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(head))}
    with agent_process("--model-repository", str(repo), "--port", "0") as agent:
        wait_until(lambda: _ready(agent.address), what="readiness")

        def call(_: int) -> httpx.Response:
            with httpx.Client(timeout=120) as client:
                return client.post(
                    f"{agent.address}/v2/models/cnn/infer", content=head + raw, headers=headers
                )

        def accepted_and_in_flight() -> tuple[float, float]:
            """(requests the agent has taken, of which still unanswered), from its metrics."""
            lines = httpx.get(f"{agent.address}/metrics").text.splitlines()

            def value(prefix: str) -> float:
                return sum(float(line.split()[-1]) for line in lines if line.startswith(prefix))

            in_flight = value('edgefleet_pending_requests{model="cnn"')
            return value('edgefleet_requests_total{model="cnn"') + in_flight, in_flight

        def six_taken_some_in_flight() -> bool:
            accepted, in_flight = accepted_and_in_flight()
            return accepted == 6 and in_flight >= 1

        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(call, i) for i in range(6)]
            # all six taken by the agent, and at least one still running, when SIGTERM lands
            wait_until(six_taken_some_in_flight, what="six requests taken, some in flight")
            agent.proc.send_signal(signal.SIGTERM)
            responses = [f.result() for f in futures]
        assert [r.status_code for r in responses] == [200] * 6
        expected = np.concatenate([golden.outputs["logits"]] * 12)
        for r in responses:
            logits = np.array(r.json()["outputs"][0]["data"]).reshape(24, 1000)
            np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-3)
        assert agent.proc.wait(timeout=60) == 0
        assert "models closed" in agent.log_messages()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{agent.address}/v2/health/live")


def test_unix_socket_with_permissions(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    sock = tmp_path / "agent.sock"
    with agent_process("--model-repository", str(repo), "--uds", str(sock)) as agent:
        assert agent.address == str(sock)
        assert stat.S_IMODE(sock.stat().st_mode) == 0o660
        transport = httpx.HTTPTransport(uds=str(sock))
        wait_until(
            lambda: _ready("http://agent", httpx.HTTPTransport(uds=str(sock))), what="readiness"
        )
        with httpx.Client(transport=transport, base_url="http://agent") as client:
            resp = client.post("/v1/models/mlp:predict", json={"instances": [[0.0] * 256]})
            assert resp.status_code == 200 and len(resp.json()["predictions"][0]) == 10
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=60) == 0
    assert not sock.exists()


def test_default_bind_is_loopback(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with agent_process("--model-repository", str(repo), "--port", "0") as agent:
        assert agent.address.startswith("http://127.0.0.1:")


def test_invalid_settings_fail_fast_with_the_field(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "edgefleet"
    result = subprocess.run(
        [str(exe), "agent", "--port", "70000"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "port" in result.stderr
    absent = str(tmp_path / "absent.toml")
    result = subprocess.run(
        [str(exe), "agent", "--config", absent], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "absent.toml does not exist" in result.stderr


def test_settings_precedence_file_env_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        'port = 9001\nlog_level = "WARNING"\nmax_rows_per_request = 10\n'
        "[runtime]\nintra_op_threads = 2\nallow_spinning = true\n"
    )
    monkeypatch.setenv("EDGEFLEET_AGENT_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("EDGEFLEET_AGENT_RUNTIME__INTRA_OP_THREADS", "3")
    settings = load_settings(config, port=9002)
    assert settings.port == 9002  # flag beats file
    assert settings.log_level == "DEBUG"  # environment beats file
    assert settings.runtime.intra_op_threads == 3 and settings.runtime.allow_spinning is True
    assert settings.max_rows_per_request == 10  # from the file
    assert settings.host == "127.0.0.1"
    config.write_text("prot = 1\n")
    with pytest.raises(ValueError, match="prot"):
        load_settings(config)
