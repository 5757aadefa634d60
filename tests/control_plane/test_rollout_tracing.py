"""A rollout as an OpenTelemetry trace, read off a real OTLP/HTTP receiver: a real Mosquitto,
control plane and agents, as the other rollout tests run them. The rollout's span continues
the trace of the call that created it; its waves, gates, operator actions and rollback are its
children; a control plane restarted mid-rollout goes on in the same trace (on SQLite and PostgreSQL: the trace context
lives in the database)."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect

from control_plane.db.session import alembic_config, migrate, sync_url
from runtimes.examples.variants import fragile_mlp_version, mlp_version
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_rollouts import (
    X,
    infer,
    push,
    rollout,
    served,
    validate,
    wait_devices,
    wait_rollout,
)
from tests.otlp import Received, Receiver, client_span


def _traced_rollout(
    cp: RunningControlPlane, headers: dict[str, str], version: int, bake_time_s: float
) -> int:
    spec = {
        "model": "mlp",
        "version": version,
        "selector": {"site": "lab"},
        "waves": ["1", "100%"],
        "bake_time_s": bake_time_s,
        "device_timeout_s": 60,
        "gates": {"allow_unjudged": True},  # no traffic: the waves pass unjudged
    }
    resp = cp.admin.post("/api/v1/rollouts", json=spec, headers=headers)
    assert resp.status_code == 201, resp.text
    return int(resp.json()["id"])


def _one(found: Receiver, name: str) -> Received:
    (span,) = found.named(name)
    return span


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_rollout_is_a_trace_under_the_call_that_created_it(
    start_control_plane: ControlPlaneFactory,
    start_agent: AgentFactory,
    receiver: tuple[Receiver, str],
    tmp_path: Path,
) -> None:
    found, endpoint = receiver
    app_span, headers, provider = client_span()
    tracing = {"enabled": True, "endpoint": endpoint}
    with (
        start_control_plane(tracing=tracing) as cp,
        start_agent("dev-a", cp) as a,
        start_agent("dev-b", cp),
    ):
        wait_devices(cp, "dev-a", "dev-b")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        rollout_id = _traced_rollout(cp, headers, 2, bake_time_s=0.5)
        assert cp.admin.post(f"/api/v1/rollouts/{rollout_id}/pause").json()["state"] == "paused"
        wait_until(lambda: served(a) == "2", what="wave 0 to switch while paused")
        assert cp.admin.post(f"/api/v1/rollouts/{rollout_id}/resume").json()["state"] == "running"
        doc = wait_rollout(cp, rollout_id, "succeeded")
        assert doc["state"] == "succeeded"
    app_span.end()
    provider.shutdown()
    ctx = app_span.get_span_context()
    post = _one(found, "POST /api/v1/rollouts")
    assert (post.trace_id, post.parent_span_id) == (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    root = _one(found, "rollout mlp v2")
    assert (root.trace_id, root.parent_span_id) == (post.trace_id, post.span_id)
    assert root.attributes["edgefleet.rollout.id"] == rollout_id
    assert root.attributes["edgefleet.model"] == "mlp"
    assert root.attributes["edgefleet.model.version"] == 2
    assert root.attributes["edgefleet.rollout.state"] == "succeeded"
    assert root.attributes["resource:service.name"] == "edgefleet-control-plane"
    children = found.children(root)
    assert {"wave 0", "wave 1", "pause", "resume"} <= set(children)
    for number in (0, 1):
        wave = children[f"wave {number}"]
        assert wave.trace_id == post.trace_id
        assert wave.attributes["edgefleet.rollout.wave"] == number
        assert wave.attributes["edgefleet.rollout.wave.devices"] == 1
        assert wave.attributes["edgefleet.rollout.wave.devices_sent"] == 1
        assert wave.attributes["edgefleet.rollout.wave.devices_committed"] == 1
        assert wave.attributes["edgefleet.rollout.wave.outcome"] == "passed"
        gates = found.children(wave)[f"gates wave {number}"]
        assert gates.attributes["edgefleet.gate.verdict"] == "passed"
        # the figures of the gate report the API shows (too few requests to judge)
        report = doc["gate_report"][str(number)]
        assert gates.attributes["edgefleet.gate.requests"] == report["requests"]
        assert gates.attributes["edgefleet.gate.errors"] == report["errors"]
        assert gates.attributes["edgefleet.gate.note"] == report["note"]
        assert wave.start_ns <= gates.start_ns <= gates.end_ns <= wave.end_ns
        # the judgement's span covers the bake (0.5 s) it waited out
        assert gates.end_ns - gates.start_ns >= 0.5e9
    assert children["wave 0"].end_ns <= children["wave 1"].start_ns
    assert root.start_ns <= children["wave 0"].start_ns and children["wave 1"].end_ns <= root.end_ns
    assert children["pause"].attributes["edgefleet.rollout.actor"] == doc["created_by"]
    # the pause and resume calls (no traceparent sent) are traces of their own
    calls = found.named("POST /api/v1/rollouts/{rollout_id}/{action}")
    assert len(calls) == 2 and post.trace_id not in {c.trace_id for c in calls}


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_aborted_rollout_has_a_rollback_span(
    start_control_plane: ControlPlaneFactory,
    start_agent: AgentFactory,
    receiver: tuple[Receiver, str],
    tmp_path: Path,
) -> None:
    found, endpoint = receiver
    app_span, headers, provider = client_span()
    with (
        start_control_plane(tracing={"enabled": True, "endpoint": endpoint}) as cp,
        start_agent("dev-a", cp) as a,
        start_agent("dev-b", cp) as b,
    ):
        wait_devices(cp, "dev-a", "dev-b")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        rollout_id = _traced_rollout(cp, headers, 2, bake_time_s=600)
        wait_until(lambda: served(a) == "2", what="wave 0 to switch")
        assert cp.admin.post(f"/api/v1/rollouts/{rollout_id}/abort").status_code == 200
        doc = wait_rollout(cp, rollout_id, "rolled_back")
        assert served(a) == "1" and served(b) == "1"
    app_span.end()
    provider.shutdown()
    root = _one(found, "rollout mlp v2")
    assert root.parent_span_id == _one(found, "POST /api/v1/rollouts").span_id
    assert root.attributes["edgefleet.rollout.state"] == "rolled_back"
    assert root.attributes["edgefleet.rollout.reason"] == doc["reason"]
    children = found.children(root)
    assert {"wave 0", "abort", "rollback"} <= set(children)
    assert "wave 1" not in children  # never began
    wave, rollback = children["wave 0"], children["rollback"]
    assert wave.attributes["edgefleet.rollout.wave.outcome"] == "rolled_back"
    assert "gates wave 0" not in found.children(wave)  # still baking: no verdict
    assert children["abort"].attributes["edgefleet.rollout.actor"] == doc["created_by"]
    assert rollback.attributes["edgefleet.rollout.devices.reverted"] == 1
    assert wave.end_ns <= rollback.start_ns <= rollback.end_ns <= root.end_ns


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_failed_gate_is_a_failed_span_with_the_report_s_figures(
    start_control_plane: ControlPlaneFactory,
    start_agent: AgentFactory,
    receiver: tuple[Receiver, str],
    tmp_path: Path,
) -> None:
    found, endpoint = receiver
    with (
        start_control_plane(tracing={"enabled": True, "endpoint": endpoint}) as cp,
        start_agent("dev-a", cp) as a,
        start_agent("dev-b", cp),
    ):
        wait_devices(cp, "dev-a", "dev-b")
        push(cp.admin, "mlp", 2, [(fragile_mlp_version(tmp_path / "v2", seed=5), [])])
        validate(cp.admin, "mlp", 2)
        rollout_id = rollout(
            cp, 2, bake_time_s=60, gates={"max_error_rate": 0.05, "min_requests": 10}
        )
        wait_until(lambda: served(a) == "2", what="wave 0 (dev-a) to switch")
        poison = X.copy()
        poison[:, 0] = 500.0  # the fragile version fails on these
        for _ in range(30):
            infer(a, poison)
        doc = wait_rollout(cp, rollout_id, "rolled_back")
    root = _one(found, "rollout mlp v2")
    wave = found.children(root)["wave 0"]
    gates = found.children(wave)["gates wave 0"]
    report = doc["gate_report"]["0"]
    assert gates.attributes["edgefleet.gate.verdict"] == "failed"
    assert gates.attributes["edgefleet.gate.reason"] == doc["reason"]
    assert "error rate" in doc["reason"]
    assert gates.attributes["edgefleet.gate.error_rate"] == report["error_rate"] > 0.05
    assert gates.attributes["edgefleet.gate.errors"] == report["errors"]
    assert gates.attributes["edgefleet.gate.requests"] == report["requests"]
    assert root.attributes["edgefleet.rollout.state"] == "rolled_back"
    rollback = found.children(root)["rollback"]
    assert rollback.attributes["edgefleet.rollout.devices.reverted"] == 1
    assert gates.end_ns <= wave.end_ns <= rollback.start_ns


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_failed_shadow_phase_is_a_span_of_its_wave(
    start_control_plane: ControlPlaneFactory,
    start_agent: AgentFactory,
    receiver: tuple[Receiver, str],
    tmp_path: Path,
) -> None:
    found, endpoint = receiver
    with (
        start_control_plane(tracing={"enabled": True, "endpoint": endpoint}) as cp,
        start_agent("dev-a", cp) as a,
    ):
        wait_devices(cp, "dev-a")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        spec = {
            "model": "mlp",
            "version": 2,
            "selector": {"site": "lab"},
            "waves": ["100%"],
            "gates": {"allow_unjudged": True},
            # no traffic: far fewer shadowed requests than asked for when the phase times out
            "shadow": {"min_requests": 100000, "timeout_s": 1},
        }
        created = cp.admin.post("/api/v1/rollouts", json=spec)  # no traceparent: a root
        assert created.status_code == 201, created.text
        doc = wait_rollout(cp, int(created.json()["id"]), "rolled_back")
        assert served(a) == "1"
    root = _one(found, "rollout mlp v2")
    post = _one(found, "POST /api/v1/rollouts")
    assert (root.trace_id, root.parent_span_id) == (post.trace_id, post.span_id)
    wave = found.children(root)["wave 0"]
    shadow = found.children(wave)["shadow wave 0"]
    phase = doc["shadow"]["waves"]["0"]
    assert shadow.attributes["edgefleet.shadow.verdict"] == "failed"
    assert shadow.attributes["edgefleet.shadow.reason"] == phase["reason"] == doc["reason"]
    assert shadow.attributes["edgefleet.shadow.requests"] == phase["requests"]
    assert shadow.attributes["edgefleet.rollout.wave"] == 0
    assert wave.start_ns <= shadow.start_ns <= shadow.end_ns <= wave.end_ns
    assert "gates wave 0" not in found.children(wave)  # never switched, never judged
    assert wave.attributes["edgefleet.rollout.wave.outcome"] == "rolled_back"
    assert wave.attributes["edgefleet.rollout.wave.devices_sent"] == 0
    assert "rollback" in found.children(root)


@pytest.mark.slow
def test_a_control_plane_restarted_mid_rollout_continues_its_trace(
    start_control_plane: ControlPlaneFactory,
    start_agent: AgentFactory,
    receiver: tuple[Receiver, str],
    tmp_path: Path,
) -> None:
    found, endpoint = receiver
    app_span, headers, provider = client_span()
    tracing = {"enabled": True, "endpoint": endpoint}
    first = ExitStack()
    cp = first.enter_context(start_control_plane(tracing=tracing))
    with start_agent("dev-a", cp) as a, start_agent("dev-b", cp) as b:
        wait_devices(cp, "dev-a", "dev-b")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        rollout_id = _traced_rollout(cp, headers, 2, bake_time_s=3)
        wait_until(lambda: served(a) == "2", what="wave 0")
        first.close()  # the control plane goes away while wave 0 bakes
        before = {s.name for s in found.spans}
        restarted_ns = time.time_ns()
        with start_control_plane(tracing=tracing) as again:
            assert wait_rollout(again, rollout_id, "succeeded")["state"] == "succeeded"
            assert served(b) == "2"
    app_span.end()
    provider.shutdown()
    # the first process ended none of the rollout's spans: the second exported them all
    assert not {n for n in before if n.startswith(("rollout ", "wave ", "gates "))}
    post = _one(found, "POST /api/v1/rollouts")
    root = _one(found, "rollout mlp v2")
    assert (root.trace_id, root.parent_span_id) == (post.trace_id, post.span_id)
    children = found.children(root)
    for number in (0, 1):
        wave = children[f"wave {number}"]
        assert wave.trace_id == post.trace_id
        assert (
            found.children(wave)[f"gates wave {number}"].attributes["edgefleet.gate.verdict"]
            == "passed"
        )
    # wave 0's span began in the first process and ended in the second
    assert root.start_ns <= children["wave 0"].start_ns < restarted_ns
    assert restarted_ns < children["wave 0"].end_ns


def test_the_trace_column_migrates_up_and_down(tmp_path: Path) -> None:
    """Revision 0020 adds the rollouts' trace context, and goes back down and up again."""
    url = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
    migrate(url)
    engine = create_engine(sync_url(url))

    def columns() -> set[str]:
        with engine.connect() as conn:
            return {c["name"] for c in inspect(conn).get_columns("rollouts")}

    assert "trace" in columns()
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0019")
    assert "trace" not in columns() and "shadow" in columns()
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
    assert "trace" in columns()
    engine.dispose()


def test_a_control_plane_that_does_not_trace_never_loads_the_sdk() -> None:
    """Tracing off costs nothing: the rollout engine holds a span object that does nothing,
    and nothing the composition root loads imports OpenTelemetry's SDK or exporter (its API
    is FastAPI's own import)."""
    code = (
        "import sys\n"
        "import control_plane.main, control_plane.app, control_plane.rollouts.engine\n"
        "from control_plane.rollouts.tracing import RolloutSpans\n"
        "RolloutSpans().begin(None)\n"
        "sdk = ('opentelemetry.sdk', 'opentelemetry.exporter')\n"
        "print(sorted(m for m in sys.modules if m.startswith(sdk)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"
