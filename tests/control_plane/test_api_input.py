"""What the control plane's API must refuse with a 4xx rather than pass to the database, on
SQLite and PostgreSQL (which, unlike SQLite, enforces column widths): names past their column,
and the same version created by two requests at once. And what it answers: timestamps with
their offset on both."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from common.release_tree import pack
from control_plane.db.models import (
    CapturedSampleRecord,
    Device,
    DeviceDiagnostic,
    DeviceSample,
    TelemetrySample,
)
from control_plane.db.session import sync_url
from runtimes.examples.variants import mlp_version
from tests.control_plane.conftest import ControlPlaneFactory
from tests.control_plane.test_rollouts import push, rollout, validate

VERSION = {"version": 1, "variants": [{"format": "onnx", "profiles": []}]}


def test_names_longer_than_their_column_are_400s_naming_the_field(
    start_control_plane: ControlPlaneFactory,
) -> None:
    with start_control_plane() as cp:
        resp = cp.admin.post(f"/api/v1/models/{'m' * 129}/versions", json=VERSION)
        assert resp.status_code == 400 and resp.json()["error"].startswith("name:"), resp.text
        resp = cp.admin.post("/api/v1/tokens", json={"name": "t" * 129, "role": "viewer"})
        assert resp.status_code == 400 and resp.json()["error"].startswith("name:"), resp.text
        assert (
            cp.admin.post(f"/api/v1/models/{'m' * 128}/versions", json=VERSION).status_code == 201
        )


def test_one_version_created_by_many_requests_at_once_is_one_201_and_409s(
    start_control_plane: ControlPlaneFactory,
) -> None:
    with (
        start_control_plane() as cp,
        cp.client(cp.token("operator")) as client,
        ThreadPoolExecutor(8) as pool,
    ):
        for name in ("race-a", "race-b", "race-c"):  # the model is new too: two rows to race
            url = f"/api/v1/models/{name}/versions"
            answers = list(pool.map(lambda u: client.post(u, json=VERSION), [url] * 8))
            statuses = sorted(a.status_code for a in answers)
            assert statuses == [201] + [409] * 7, [a.text for a in answers]


def test_every_timestamp_the_api_shows_carries_its_offset(
    start_control_plane: ControlPlaneFactory, db_url: str, tmp_path: Path
) -> None:
    """RFC 3339: each timestamp of every GET route (read from the OpenAPI document, so a new
    route is checked too) says its offset; SQLite hands back UTC wall times without one."""
    now = datetime.now(UTC)
    with start_control_plane() as cp:
        push(cp.admin, "mlp", 1, [(mlp_version(tmp_path / "v1", seed=1), [])])
        validate(cp.admin, "mlp", 1)
        engine = create_engine(sync_url(db_url))
        with Session(engine) as s, s.begin():
            s.add(Device(id="dev-t", reported_labels={"site": "lab"}, online=True, last_seen=now))
            s.add(
                TelemetrySample(
                    **{"device_id": "dev-t", "seq": 1, "time": now, "received_at": now},
                    **{"window_s": 1.0, "model": "mlp", "version": 1},
                    **{"requests": 1, "errors": 0, "rows": 1, "batches": 1},
                )
            )
            s.add(DeviceSample(device_id="dev-t", seq=1, time=now))  # its last_telemetry
            s.add(
                CapturedSampleRecord(
                    **{"device_id": "dev-t", "sample_id": "s1", "model": "mlp", "version": 1},
                    **{"captured_at": now, "received_at": now, "trigger": "sampled"},
                    **{"rows": 1, "size_bytes": 1, "data": b"x"},
                )
            )
            s.add(
                DeviceDiagnostic(
                    **{"id": "d1", "device_id": "dev-t", "kind": "logs", "params": {}},
                    **{"requested_by": "t", "requested_at": now, "expires_at": now},
                    **{"state": "complete", "total_bytes": 1, "received_bytes": 1},
                    **{"data": b"\n", "completed_at": now},
                )
            )
        engine.dispose()
        rollout_id = rollout(cp, 1, waves=["100%"])
        # an agent release called "1": the routes' {version} is either
        agent = pack(tmp_path / "agent-1.tar.gz", "1").read_bytes()
        assert cp.admin.put("/api/v1/agent-releases/1", content=agent).status_code == 201
        # a deployment named as the model: the routes' {name} is either
        deployment = {"name": "mlp", "model": "mlp", "version": 1}
        assert cp.admin.post("/api/v1/deployments", json=deployment).status_code == 201
        ids = {
            "device_id": "dev-t",
            "rollout_id": rollout_id,
            "name": "mlp",
            "version": 1,
            "sample": 1,
            "request_id": "d1",
        }
        queries = {"/api/v1/telemetry": {"device_id": "dev-t"}}
        seen: dict[str, list[str]] = {}
        for route, operations in cp.admin.get("/openapi.json").json()["paths"].items():
            if "get" not in operations or route in NOT_JSON:
                continue
            resp = cp.admin.get(route.format(**ids), params=queries.get(route, {}))
            assert resp.status_code == 200, f"{route}: {resp.text}"
            seen[route] = list(timestamps(resp.json()))
        for route, stamps in seen.items():
            naive = [s for s in stamps if datetime.fromisoformat(s).tzinfo is None]
            assert not naive, f"{route}: {naive}"
    shown = {k for stamps in seen.values() for k in stamps}
    assert len(shown) >= 5, seen  # versions, rollouts, devices and telemetry all had some
    routes = ("/api/v1/rollouts/{rollout_id}", "/api/v1/devices", "/api/v1/devices/{device_id}")
    for route in (*routes, "/api/v1/telemetry"):
        assert seen[route], f"{route} showed no timestamp: {seen}"


NOT_JSON = {
    "/metrics",
    "/artifacts/sha256/{digest}",
    "/api/v1/models/{name}/versions/{version}/samples/{sample}/data",  # an .npz archive
    "/api/v1/devices/{device_id}/diagnostics/{request_id}/data",  # JSON lines
}
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def timestamps(doc: Any) -> Iterator[str]:
    """Every string in ``doc`` that is a date and time."""
    if isinstance(doc, dict):
        for value in doc.values():
            yield from timestamps(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from timestamps(value)
    elif isinstance(doc, str) and STAMP.match(doc):
        yield doc
