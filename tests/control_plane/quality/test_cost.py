"""Cost per thousand predictions (issue 50, item 5): a real agent serves the example models
with their shipped defaults and sends telemetry over a real broker; the operator sets rates
with the CLI; the control plane's cost per 1,000 predictions equals the rate times the busy
time the agent's own statistics extension counts (each batch's stacking, backend run and
split, over the version's instances), per row, within 5 %; so do the fleet's Prometheus
counters of busy time and cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.fleet.settings import FleetSettings
from tests.agent.server import RunningAgent, copy_models, serve, wait_until
from tests.control_plane.quality.conftest import edgefleet
from tests.control_plane.server import RunningControlPlane
from tests.mqtt_broker import Mosquitto

LAB_RATE = 0.9
"""Per hour of a device labelled site=cost-lab."""


def busy_and_rows(agent: RunningAgent, model: str) -> tuple[float, int]:
    """The device time ``model`` v1 took (its statistics' batch times over its instance
    count) and the rows it answered, as the agent's statistics extension reports them."""
    (stats,) = agent.client.get(f"/v2/models/{model}/versions/1/stats").json()["model_stats"]
    busy_ns = sum(
        b[k]["ns"]
        for b in stats["batch_stats"]
        for k in ("compute_input", "compute_infer", "compute_output")
    )
    config = agent.client.get(f"/v2/models/{model}/versions/1/config").json()
    instances = sum(g["count"] for g in config["instance_group"])
    return busy_ns / 1e9 / instances, stats["inference_count"]


def counter(metrics: str, series: str) -> float:
    (value,) = [float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(series)]
    return value


def cost_of(cp: RunningControlPlane, model: str) -> dict[str, Any]:
    shown = edgefleet(cp, "costs", "show", model, "1", "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    doc: dict[str, Any] = json.loads(shown.stdout)
    return doc


def test_cost_per_1k_predictions_is_busy_time_times_the_rate(
    cp: RunningControlPlane, broker: Mosquitto, examples: Path, tmp_path: Path
) -> None:
    fleet = FleetSettings(
        mqtt_url=broker.url,
        device_id="cost-box",
        labels={"site": "cost-lab"},
        state_dir=tmp_path / "state",
        trust_root_file=cp.trust_root_file,
        telemetry_interval_s=0.5,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
    )
    repo = copy_models(examples, tmp_path / "repo", "digits", "mlp")
    rng = np.random.default_rng(5)
    with serve(repo, fleet=fleet) as agent:
        wait_until(
            lambda: cp.admin.get("/api/v1/devices/cost-box").status_code == 200,
            what="the device in the inventory",
        )
        rates = edgefleet(
            cp, "costs", "set-rates", "--default", "0.1", "--label", f"site=cost-lab:{LAB_RATE}"
        )
        assert rates.returncode == 0, rates.stdout + rates.stderr
        assert "label site=cost-lab: 0.9 per hour" in rates.stdout
        for size in (1, 8, 32) * 20:  # every example model loaded, both answering
            assert agent.infer_json("digits", rng.uniform(0, 16, (size, 64))).status_code == 200
            assert agent.infer_json("mlp", rng.normal(0, 1, (size, 256))).status_code == 200
        expected = {m: busy_and_rows(agent, m) for m in ("digits", "mlp")}
        wait_until(
            lambda: all(cost_of(cp, m)["rows"] == expected[m][1] for m in expected),
            timeout_s=30,
            what="every answered row in the control plane's telemetry",
        )
        docs = {m: cost_of(cp, m) for m in expected}
        metrics = cp.admin.get("/metrics").text
    for model, (busy_s, rows) in expected.items():
        doc = docs[model]
        (device,) = doc["devices"]
        assert (device["device_id"], device["rate"]) == ("cost-box", "label site=cost-lab")
        assert device["per_hour"] == LAB_RATE and doc["unpriced_devices"] == []
        assert busy_s > 0 and doc["busy_s"] == pytest.approx(busy_s, rel=0.05)
        per_1k = LAB_RATE * busy_s / 3600 / rows * 1000
        assert doc["per_1k_predictions"] == pytest.approx(per_1k, rel=0.05), (model, doc)
        # the fleet's counters, as ingest charged each window at the device's rate
        labels = f'{{model="{model}",version="1"}}'
        assert counter(metrics, f"edgefleet_fleet_busy_seconds_total{labels}") == pytest.approx(
            busy_s, rel=0.05
        )
        assert counter(metrics, f"edgefleet_fleet_cost_total{labels}") == pytest.approx(
            LAB_RATE * busy_s / 3600, rel=0.05
        )
    shown = edgefleet(cp, "costs", "show", "mlp", "1")
    assert shown.returncode == 0 and "per 1,000 predictions" in shown.stdout, shown.stdout
    assert "cost-box:" in shown.stdout and "(label site=cost-lab)" in shown.stdout


def test_bad_rates_are_refused_naming_the_field(cp: RunningControlPlane) -> None:
    for body, named in (
        ({"rates": [{"per_hour": -1}]}, "per_hour"),
        ({"rates": [{"label": "no-equals", "per_hour": 1}]}, "label"),
        ({"rates": [{"label": "a=b", "profile": "p", "per_hour": 1}]}, "not both"),
        ({"rates": [{"per_hour": 1}, {"per_hour": 2}]}, "a second rate for default"),
    ):
        resp = cp.admin.put("/api/v1/cost-rates", json=body)
        assert resp.status_code in (400, 422), resp.text
        assert named in resp.text, resp.text
    bad = edgefleet(cp, "costs", "set-rates", "--profile", "x86")
    assert bad.returncode != 0 and "TARGET:PER_HOUR" in bad.stderr, bad.stderr
    unknown = cp.admin.get("/api/v1/models/nope/versions/1/cost")
    assert unknown.status_code == 404, unknown.text
