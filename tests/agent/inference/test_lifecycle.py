"""Model lifecycle on a real agent: hot swap under load, failed loads, version policies,
memory budget, unload, start-up with a broken model."""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest

from runtimes.golden import GoldenSample
from tests.agent.server import RunningAgent, copy_models, serve, wait_until
from tests.runtimes.fake_machines import MACHINES

ROW = np.zeros((1, 256), np.float32)


def add_version(repo: Path, model: str, source: str, version: int) -> Path:
    target = repo / model / str(version)
    shutil.copytree(repo / model / source, target)
    return target


def infer(client: httpx.Client, model: str = "mlp", version: str | None = None) -> httpx.Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    tensor = {"name": "input", "shape": [1, 256], "datatype": "FP32", "data": ROW.ravel().tolist()}
    return client.post(path, json={"inputs": [tensor]})


def index(agent: RunningAgent) -> dict[tuple[str, str], tuple[str, str]]:
    return {
        (r["name"], r["version"]): (r["state"], r["reason"])
        for r in agent.client.get("/v2/repository/index").json()
    }


class Stream:
    """Clients sending requests back to back until stopped; counts every answer."""

    def __init__(self, agent: RunningAgent, clients: int = 4) -> None:
        self.agent, self.stop = agent, threading.Event()
        self.codes: Counter[int] = Counter()
        self.versions: list[str] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(base_url=self.agent.url, timeout=60) as client:
            while not self.stop.is_set():
                try:
                    resp = infer(client)
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.errors.append(repr(exc))
                    continue
                with self._lock:
                    self.codes[resp.status_code] += 1
                    if resp.status_code == 200:
                        self.versions.append(resp.json()["model_version"])

    def __enter__(self) -> Stream:
        for t in self._threads:
            t.start()
        wait_until(lambda: sum(self.codes.values()) > 20, what="the stream to flow")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join()


def test_hot_swap_under_a_stream_of_requests_fails_none(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo) as agent:
        with Stream(agent) as stream:
            add_version(repo, "mlp", "1", 2)
            loaded = agent.client.post("/v2/repository/models/mlp/load")
            assert loaded.status_code == 200 and loaded.json()["versions"] == ["2"]
            served_before = len(stream.versions)
            wait_until(
                lambda: stream.versions[served_before:].count("2") > 20, what="version 2 to answer"
            )
        wait_until(lambda: ("mlp", "1") not in index(agent), what="version 1 to close")
        assert index(agent)[("mlp", "2")] == ("READY", "")
    assert stream.errors == []
    assert set(stream.codes) == {200}, stream.codes
    # every answer came from one version or the other; after the switch only from 2
    assert set(stream.versions) == {"1", "2"}
    assert stream.versions[-1] == "2"


def test_failed_load_keeps_the_old_version_serving(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo) as agent, Stream(agent) as stream:
        broken = add_version(repo, "mlp", "1", 2)
        (broken / "model.onnx").write_bytes((broken / "model.onnx").read_bytes()[:5000])
        resp = agent.client.post("/v2/repository/models/mlp/load")
        assert resp.status_code == 400
        assert resp.json()["code"] == "load_failed"
        assert (
            "version 2" in resp.json()["error"]
            and "Protobuf parsing failed" in resp.json()["error"]
        )
        assert index(agent)[("mlp", "1")] == ("READY", "")
        state, reason = index(agent)[("mlp", "2")]
        assert state == "UNAVAILABLE" and "Protobuf parsing failed" in reason
        assert infer(agent.client).json()["model_version"] == "1"
        assert infer(agent.client, version="2").status_code == 503
    assert set(stream.codes) == {200} and stream.errors == []
    assert set(stream.versions) == {"1"}


def test_version_failing_its_self_test_is_not_switched_to(
    example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo) as agent:
        v2 = add_version(repo, "mlp", "1", 2)
        golden = GoldenSample.load(v2 / "golden.npz")
        wrong = {k: v + 1.0 for k, v in golden.outputs.items()}
        GoldenSample(golden.inputs, wrong, golden.rtol, golden.atol).save(v2 / "golden.npz")
        resp = agent.client.post("/v2/repository/models/mlp/load")
        assert resp.status_code == 400 and "self-test failed" in resp.json()["error"]
        assert "output 'logits' differs by up to 1" in resp.json()["error"]
        assert infer(agent.client).json()["model_version"] == "1"


def test_version_policies(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    for v in (2, 3):
        add_version(repo, "mlp", "1", v)
    (repo / "mlp/config.toml").write_text("[version_policy]\nall = true\n")
    with serve(repo) as agent:
        assert sorted(v for (m, v) in index(agent) if m == "mlp") == ["1", "2", "3"]
        assert infer(agent.client).json()["model_version"] == "3"  # newest by default
        assert infer(agent.client, version="1").json()["model_version"] == "1"
        (repo / "mlp/config.toml").write_text("[version_policy]\nspecific = [1, 3]\n")
        assert agent.client.post("/v2/repository/models/mlp/load").json()["versions"] == ["1", "3"]
        assert infer(agent.client, version="2").status_code in (404, 503)
        (repo / "mlp/config.toml").write_text("[version_policy]\nlatest = 2\n")
        assert agent.client.post("/v2/repository/models/mlp/load").json()["versions"] == ["2", "3"]
        wait_until(lambda: ("mlp", "1") not in index(agent), what="version 1 to close")


def test_config_change_reloads_the_same_version(example_repo: Path, tmp_path: Path) -> None:
    untuned = "[batching]\ntune = false\n"  # the batch size as written, not as measured
    repo = copy_models(example_repo, tmp_path / "repo", "mlp", configs={"mlp": untuned})
    with serve(repo) as agent:
        assert (
            agent.client.get("/v2/models/mlp/config").json()["edgefleet"]["batching"][
                "max_batch_size"
            ]
            == 32
        )
        (repo / "mlp/config.toml").write_text(untuned + "max_batch_size = 8\n")
        assert agent.client.post("/v2/repository/models/mlp/load").status_code == 200
        assert (
            agent.client.get("/v2/models/mlp/config").json()["edgefleet"]["batching"][
                "max_batch_size"
            ]
            == 8
        )
        (repo / "mlp/config.toml").write_text("[batching]\nmax_batch_size = -1\n")
        resp = agent.client.post("/v2/repository/models/mlp/load")
        assert resp.status_code == 400 and "field batching.max_batch_size" in resp.json()["error"]
        assert (
            agent.client.get("/v2/models/mlp/config").json()["edgefleet"]["batching"][
                "max_batch_size"
            ]
            == 8
        )


def test_unload_then_load_again(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp", "mlp_tflite")
    with serve(repo) as agent:
        assert agent.client.post("/v2/repository/models/mlp/unload").status_code == 200
        assert infer(agent.client).status_code == 404
        assert index(agent)[("mlp", "")] == ("UNAVAILABLE", "unloaded")
        # unloaded on purpose: readiness is about the models meant to serve
        assert agent.client.get("/v2/health/ready").status_code == 200
        assert agent.client.post("/v2/repository/models/mlp/load").status_code == 200
        assert infer(agent.client).status_code == 200
        assert agent.client.get("/v2/health/ready").status_code == 200


def test_broken_model_at_start_up_is_reported_and_the_others_serve(
    example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp", "cnn")
    (repo / "cnn/1/model.onnx").write_bytes(b"not a model")
    with serve(repo) as agent:
        assert infer(agent.client).status_code == 200
        state, reason = index(agent)[("cnn", "1")]
        assert state == "UNAVAILABLE" and "model.onnx" in reason
        assert agent.client.get("/v2/models/cnn/ready").status_code == 503
        assert agent.client.get("/v2/health/ready").status_code == 503
    with serve(repo, strict_readiness=False) as agent:
        assert agent.client.get("/v2/health/ready").status_code == 200


def test_memory_budget_refuses_a_load_and_evicts_idle_evictable_models(
    example_repo: Path, tmp_path: Path
) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    # the generic profile with a 20 MiB budget; each model declares 12 MiB: one fits, not two
    text = (Path(__file__).parents[3] / "hardware_profiles/generic-x86_64.toml").read_text()
    (profiles / "small.toml").write_text(
        text.replace("memory_budget_fraction = 0.6", "memory_budget_mb = 20")
    )
    root = MACHINES["generic-x86_64"].build(tmp_path / "root")
    configs = {"mlp": "memory_mb = 12\nevictable = true\ninstances = 1\n"}
    repo = copy_models(example_repo, tmp_path / "repo", "mlp", configs=configs)
    with serve(repo, profiles_dir=profiles, hardware_root=root) as agent:
        for name in ("mlp_b", "mlp_c"):
            shutil.copytree(repo / "mlp", repo / name)
            (repo / name / "config.toml").write_text("memory_mb = 12\ninstances = 1\n")
        # mlp is idle and evictable: it makes room for mlp_b
        assert agent.client.post("/v2/repository/models/mlp_b/load").status_code == 200
        assert infer(agent.client, "mlp_b").status_code == 200
        assert infer(agent.client).status_code == 404
        # mlp_b is not evictable: mlp_c is refused, and mlp_b keeps serving
        resp = agent.client.post("/v2/repository/models/mlp_c/load")
        assert resp.status_code == 409 and resp.json()["code"] == "memory_budget_exceeded"
        assert (
            "loading mlp_c:1 needs about 12 MiB but the memory budget of profile generic-x86_64 "
            "is 20 MiB with 12 MiB in use (mlp_b 12 MiB)" in resp.json()["error"]
        )
        assert infer(agent.client, "mlp_b").status_code == 200
        assert index(agent)[("mlp_c", "1")][0] == "UNAVAILABLE"
        text = agent.client.get("/metrics").text
        assert 'edgefleet_model_memory_bytes{model="mlp_b",version="1"} 1.2582912e+07' in text


def test_load_of_a_model_not_in_the_repository_is_404(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo) as agent:
        for name in ("ghost", "..", ".hidden"):
            assert agent.client.post(f"/v2/repository/models/{name}/load").status_code == 404


@pytest.mark.parametrize("instances", [2])
def test_instances_split_threads_and_all_serve(
    example_repo: Path, tmp_path: Path, instances: int
) -> None:
    repo = copy_models(
        example_repo, tmp_path / "repo", "mlp", configs={"mlp": f"instances = {instances}\n"}
    )
    with serve(repo) as agent:
        threads = [
            threading.Thread(target=lambda: [infer(agent.client) for _ in range(20)])
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = agent.client.get("/v2/models/mlp/stats").json()["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == 80
