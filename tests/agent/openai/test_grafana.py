"""The dashboard's agent panels (docs/grafana-dashboard.json, below its "Agent" row) query
series a real agent exports: scraped from an agent serving ``mlp`` and ``tiny-lm`` after a
request to each, every metric a panel names is there with every label the panel groups by.
Accelerator use, which needs hardware, comes from the agent's metrics over a fake sysfs (the
probe's root seam)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agent.accelerators import AcceleratorProbe
from agent.metrics import AgentMetrics
from tests.agent.openai.conftest import MODEL
from tests.agent.server import RunningAgent

DASHBOARD = Path(__file__).parents[3] / "docs" / "grafana-dashboard.json"
SUFFIXES = ("_bucket", "_total", "_count", "_sum")


def agent_panels() -> list[dict[str, object]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    rows = [i for i, p in enumerate(panels) if p["type"] == "row"]
    assert rows, "the dashboard has no agent row"
    return panels[rows[0] + 1 :]  # type: ignore[no-any-return]


def labels_by_sample(text: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_every_agent_panel_queries_series_an_agent_exports(
    agent: RunningAgent, tmp_path: Path
) -> None:
    assert agent.infer_json("mlp", [[0.25] * 256]).status_code == 200
    done = agent.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "The fleet", "max_tokens": 4}
    )
    assert done.status_code == 200, done.text
    exported = labels_by_sample(agent.client.get("/metrics").text)
    load = tmp_path / "sys/devices/platform/gpu.0/load"
    load.parent.mkdir(parents=True)
    load.write_text("437\n")
    with_gpu = AgentMetrics(accelerators=AcceleratorProbe(tmp_path)).render().decode()
    exported |= labels_by_sample(with_gpu)
    checked = 0
    for panel in agent_panels():
        for target in panel["targets"]:  # type: ignore[attr-defined]
            expr = target["expr"]
            assert '{instance=~"$instance"' in expr, expr  # each follows the instance picker
            grouped = set()
            for by in re.findall(r"by \(([^)]*)\)", expr):
                grouped |= {label.strip() for label in by.split(",")} - {"le"}
            for name in re.findall(r"edgefleet_[a-z_0-9]+", expr):
                assert name in exported, f"{panel['title']}: {name} is not exported"
                missing = grouped - exported[name]
                assert not missing, f"{panel['title']}: {name} has no label {missing}"
                checked += 1
    assert checked >= 12
