"""The agent's optional API key and per-client rate limit, on a real server."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from agent.serving.access import ApiKeys
from agent.settings import AgentSettings
from tests.agent.server import RunningAgent, copy_models, serve
from tests.hardening.rawhttp import connect, head, read_response

KEY = "k3y-for-the-app-7d1f0c"
OTHER = "other-client-key-b2e9"


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    root = tmp_path_factory.mktemp("keys")
    keys_file = root / "api-keys"
    keys_file.write_text(f"# one per line\nbilling:{OTHER}\n")
    repo = copy_models(example_repo, root / "repo", "mlp")
    with serve(repo, api_key=KEY, api_keys_file=keys_file) as running:
        yield running


def get(agent: RunningAgent, path: str, **headers: str) -> httpx.Response:
    with httpx.Client(base_url=agent.url, timeout=30) as client:
        return client.get(path, headers=headers)


@pytest.mark.parametrize("path", ["/v2", "/v2/models/mlp", "/v1/models/mlp", "/metrics"])
def test_without_a_key_every_endpoint_is_401(agent: RunningAgent, path: str) -> None:
    resp = get(agent, path)
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"].startswith("Bearer")
    assert resp.json() == {
        "error": "an API key is required: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
        "code": "unauthorized",
    }


def test_inference_without_a_key_is_401_before_the_body_is_read(agent: RunningAgent) -> None:
    resp = agent.client.post("/v2/models/mlp/infer", content=b"not even JSON")
    assert resp.status_code == 401


@pytest.mark.parametrize("length", [100, 200_000], ids=["task", "whole-body-callbacks"])
def test_inference_without_a_key_is_401_before_its_body_is_sent(
    agent: RunningAgent, length: int
) -> None:
    """Also a body the agent would collect whole and answer from the connection's callbacks
    (agent.api.fastpath): admission answers at the head, before any of it is read."""
    with connect(agent.url) as sock:
        sock.sendall(head("POST", "/v2/models/mlp/infer", {"Content-Length": str(length)}))
        assert read_response(sock).status == 401


def test_a_wrong_key_is_401(agent: RunningAgent) -> None:
    for headers in (
        {"X-API-Key": KEY + "x"},
        {"Authorization": f"Bearer {KEY[:-1]}"},
        {"Authorization": f"Basic {KEY}"},
    ):
        resp = get(agent, "/v2", **headers)
        assert resp.status_code == 401, headers
    assert get(agent, "/v2", **{"X-API-Key": KEY + "x"}).json()["error"] == (
        "the API key is not valid"
    )


def test_either_header_and_either_key_is_accepted(agent: RunningAgent) -> None:
    assert get(agent, "/v2", **{"X-API-Key": KEY}).status_code == 200
    assert get(agent, "/v2", Authorization=f"Bearer {KEY}").status_code == 200
    assert get(agent, "/v2", Authorization=f"bearer {OTHER}").status_code == 200
    with httpx.Client(base_url=agent.url, headers={"X-API-Key": OTHER}) as client:
        resp = client.post(
            "/v2/models/mlp/infer",
            json={
                "inputs": [
                    {"name": "input", "shape": [1, 256], "datatype": "FP32", "data": [0.0] * 256}
                ]
            },
        )
    assert resp.status_code == 200, resp.text


def test_probes_stay_open(agent: RunningAgent) -> None:
    assert get(agent, "/v2/health/live").status_code == 200
    assert get(agent, "/v2/health/ready").status_code == 200


def test_open_paths_are_a_setting(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo, api_key=KEY, api_key_open_paths=("/metrics",)) as agent:
        assert get(agent, "/metrics").status_code == 200
        assert get(agent, "/v2/health/live").status_code == 401


def test_the_key_is_never_logged(
    example_repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo, api_key=KEY) as agent:
        get(agent, "/v2", **{"X-API-Key": KEY})
        get(agent, "/v2", **{"X-API-Key": "wrong"})
        settings = agent.state.settings
    assert caplog.records, "the agent logged nothing: the scan below would prove nothing"
    for record in caplog.records:
        assert KEY not in record.getMessage() and KEY not in str(record.__dict__)
    assert KEY not in repr(settings) and KEY not in settings.model_dump_json()


def test_bad_keys_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    blank_key = tmp_path / "blank"
    blank_key.write_text("billing:\n")
    for path, reason in (
        (empty, "holds no key"),
        (blank_key, "line 1: the key is empty"),
        (tmp_path / "absent", "No such file"),
    ):
        settings = AgentSettings(api_keys_file=path)
        with pytest.raises(ValueError, match=reason):
            ApiKeys.from_settings(settings.api_key, settings.api_keys_file)
    assert ApiKeys.from_settings(None, None) is None


def test_rate_limit_per_key_is_429_with_retry_after(example_repo: Path, tmp_path: Path) -> None:
    keys_file = tmp_path / "api-keys"
    keys_file.write_text(f"a:{KEY}\nb:{OTHER}\n")
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    # 0.01/s: no token comes back during the test, so the count is exact whatever the timing
    with serve(repo, api_keys_file=keys_file, rate_limit_per_s=0.01, rate_limit_burst=5) as agent:
        statuses = [get(agent, "/v2", **{"X-API-Key": KEY}).status_code for _ in range(8)]
        assert statuses == [200] * 5 + [429] * 3
        refused = get(agent, "/v2", **{"X-API-Key": KEY})
        assert refused.json() == {
            "error": "client a is over rate_limit_per_s=0.01 (burst 5)",
            "code": "rate_limited",
        }
        assert 1 <= int(refused.headers["retry-after"]) <= 100
        # another key has its own bucket; probes have none
        assert get(agent, "/v2", **{"X-API-Key": OTHER}).status_code == 200
        assert get(agent, "/v2/health/live").status_code == 200


def test_rate_limit_without_keys_is_per_address(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo, rate_limit_per_s=0.01, rate_limit_burst=2) as agent:
        statuses = [get(agent, "/v2").status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        assert "client 127.0.0.1 is over" in get(agent, "/v2").json()["error"]


def test_a_local_client_cannot_name_itself_another_address_for_the_rate_limit(
    example_repo: Path, tmp_path: Path
) -> None:
    """uvicorn believes X-Forwarded-For from loopback by default: any local process could
    name a new address per request and never be limited. The agent believes no proxy unless
    told (``forwarded_allow_ips``)."""
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo, rate_limit_per_s=0.01, rate_limit_burst=2) as agent:
        statuses = [
            get(agent, "/v2", **{"X-Forwarded-For": f"10.0.0.{i}"}).status_code for i in range(3)
        ]
        assert statuses == [200, 200, 429]
        refused = get(agent, "/v2", **{"X-Forwarded-For": "10.0.0.9"})
        assert "client 127.0.0.1 is over" in refused.json()["error"]


def test_a_trusted_proxy_names_the_client_for_the_rate_limit(
    example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(
        repo, rate_limit_per_s=0.01, rate_limit_burst=2, forwarded_allow_ips=("127.0.0.1",)
    ) as agent:
        behind = {"X-Forwarded-For": "10.0.0.7"}
        assert [get(agent, "/v2", **behind).status_code for _ in range(3)] == [200, 200, 429]
        assert "client 10.0.0.7 is over" in get(agent, "/v2", **behind).json()["error"]
        # another client behind the same proxy has its own bucket
        assert get(agent, "/v2", **{"X-Forwarded-For": "10.0.0.8"}).status_code == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.168.1.20", "edge-01.local"])
def test_listening_beyond_loopback_needs_a_key(host: str, tmp_path: Path) -> None:
    """Whoever reaches such an address could run, load and unload the agent's models: without
    a key the settings are refused, naming the ways out."""
    with pytest.raises(ValidationError, match="beyond loopback and no API key") as refused:
        AgentSettings(host=host)
    assert "EDGEFLEET_AGENT_ALLOW_UNAUTHENTICATED" in str(refused.value)
    keys = tmp_path / "keys"
    keys.write_text(f"app:{KEY}\n")
    assert AgentSettings(host=host, api_key=KEY).host == host
    assert AgentSettings(host=host, api_keys_file=keys).api_keys_file == keys
    assert AgentSettings(host=host, allow_unauthenticated=True).allow_unauthenticated
    # a Unix socket replaces the TCP listener; its file mode guards it
    assert AgentSettings(host=host, uds=tmp_path / "agent.sock").uds is not None


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_key(host: str) -> None:
    assert AgentSettings(host=host).api_key is None


def test_a_refused_setting_does_not_print_the_secrets_beside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error about the settings as a whole printed their input, the broker's password in it
    (the command line shows the error as it is)."""
    password = "broker-pass-4b1d9e0c7a"
    monkeypatch.setenv("EDGEFLEET_AGENT_FLEET__PASSWORD", password)
    monkeypatch.setenv("EDGEFLEET_AGENT_FLEET__MQTT_URL", "mqtt://broker.example:1883")
    monkeypatch.setenv("EDGEFLEET_AGENT_HOST", "0.0.0.0")
    with pytest.raises(ValidationError) as refused:
        AgentSettings()
    assert "beyond loopback" in str(refused.value) and password not in str(refused.value)
    monkeypatch.setenv("EDGEFLEET_AGENT_HOST", "127.0.0.1")
    monkeypatch.setenv("EDGEFLEET_AGENT_FLEET__MQTT_PROTOCOL", "3.1.1")
    monkeypatch.setenv("EDGEFLEET_AGENT_FLEET__WILL_DELAY_S", "5")
    with pytest.raises(ValidationError) as refused:
        AgentSettings()
    assert "will_delay_s" in str(refused.value) and password not in str(refused.value)


def test_the_agent_exposed_without_a_key_does_not_start(example_repo: Path, tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "edgefleet"
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    result = subprocess.run(
        [str(exe), "agent", "--model-repository", str(repo), "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("EDGEFLEET_")},
    )
    assert result.returncode != 0
    assert "beyond loopback and no API key" in result.stderr
