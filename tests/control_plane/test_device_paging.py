"""The device list pages and filters in the database; the summary counts what the list holds.

A real control plane (uvicorn, SQLite and PostgreSQL) whose inventory is written straight into
its database: 250 devices of two profiles, with labels (some overridden by an operator), served
model versions and every presence (online, silent: online but long unheard, offline)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from control_plane.db.models import Device
from tests.agent.server import wait_until
from tests.control_plane.conftest import ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane

pytestmark = pytest.mark.slow
FLEET = 250
TIMEOUT_S = 1.0


def device(device_id: str, i: int, now: datetime) -> Device:
    """Every sixth device (from 1) online but unheard for 2 h: silent; every sixth from 2 too,
    but it announced telemetry every hour, so its limit is 3 h: online. The others were heard
    now and announced 10 minutes: online (or offline) for the test's length."""
    models = [{"model": "mlp", "version": 1 + i % 3, "sequence": i}] if i % 4 else []
    if i % 7 == 0:
        models.append({"model": "cnn", "version": 10, "sequence": i})
    return Device(
        id=device_id,
        hardware_profile="raspberry-pi-5" if i % 2 else "jetson-orin",
        agent_version="1.0",
        reported_labels={"site": f"s{i % 5}", "group": "g"},
        operator_labels={"site": "ops"} if i % 10 == 0 else {},
        models=models,
        online=i % 3 != 0,
        last_seen=now - timedelta(hours=2) if i % 6 in (1, 2) else now,
        telemetry_interval_s={1: None, 2: 3600.0}.get(i % 6, 600.0),
        trust_root_version=1 + i % 2,
        desired={},
    )


def add(db_url: str, devices: dict[str, int]) -> None:
    engine = create_engine(db_url.replace("+aiosqlite", ""))
    try:
        now = datetime.now(UTC)
        with Session(engine) as s, s.begin():
            s.add_all(device(device_id, i, now) for device_id, i in devices.items())
    finally:
        engine.dispose()


@pytest.fixture
def fleet(start_control_plane: ControlPlaneFactory, db_url: str) -> Iterator[RunningControlPlane]:
    with start_control_plane(presence_timeout_s=TIMEOUT_S, last_seen_resolution_s=0.1) as cp:
        add(db_url, {f"dev-{i:03d}": i for i in range(FLEET)})
        # silence counts only once the control plane has been hearing for longer than the limit
        hearing = cp.services.metrics.hearing_since
        wait_until(
            lambda: (
                hearing is not None
                and datetime.now(UTC) - hearing > timedelta(seconds=TIMEOUT_S + 0.5)
            ),
            what="a control plane hearing for longer than the silence limit",
        )
        yield cp


def listed(cp: RunningControlPlane, **params: Any) -> list[dict[str, Any]]:
    resp = cp.admin.get("/api/v1/devices", params=params)
    assert resp.status_code == 200, resp.text
    assert "link" not in resp.headers
    return resp.json()  # type: ignore[no-any-return]


def next_page(resp: httpx.Response) -> str | None:
    link = resp.links.get("next")
    return link["url"] if link else None


def paged(cp: RunningControlPlane, **params: Any) -> list[dict[str, Any]]:
    resp = cp.admin.get("/api/v1/devices", params=params)
    out = []
    while True:
        assert resp.status_code == 200, resp.text
        out += resp.json()
        url = next_page(resp)
        if url is None:
            return out
        resp = cp.admin.get(url)


def test_pages_of_100_return_each_device_once_in_order_with_one_added_midway(
    fleet: RunningControlPlane, db_url: str
) -> None:
    first = fleet.admin.get("/api/v1/devices", params={"limit": 100})
    assert first.status_code == 200
    page = first.json()
    assert [d["id"] for d in page] == [f"dev-{i:03d}" for i in range(100)]
    # one device joins after the cursor (it will be on a later page), one before (it will not)
    add(db_url, {"dev-150a": 0, "dev-000a": 0})
    ids = [d["id"] for d in page]
    url = next_page(first)
    pages = 1
    while url is not None:
        resp = fleet.admin.get(url)
        assert resp.status_code == 200, resp.text
        assert len(resp.json()) <= 100
        ids += [d["id"] for d in resp.json()]
        url, pages = next_page(resp), pages + 1
    assert pages == 3
    everyone = [d["id"] for d in listed(fleet)]  # no limit: the whole list, as before
    assert len(everyone) == FLEET + 2
    assert ids == [i for i in everyone if i != "dev-000a"]
    assert len(set(ids)) == len(ids) == FLEET + 1
    # the last page exactly full: no next page
    last = fleet.admin.get("/api/v1/devices", params={"limit": 2, "after": everyone[-3]})
    assert [d["id"] for d in last.json()] == everyone[-2:] and next_page(last) is None


def test_filters_are_the_databases_and_match_the_rule_of_each_device(
    fleet: RunningControlPlane,
) -> None:
    everyone = listed(fleet)
    by_id = {d["id"]: d for d in everyone}
    n = {d["id"]: int(d["id"][4:]) for d in everyone}
    expected = {
        i: "offline" if i % 3 == 0 else "silent" if i % 6 == 1 else "online" for i in range(FLEET)
    }
    assert {d["id"]: d["presence"] for d in everyone} == {
        f"dev-{i:03d}": p for i, p in expected.items()
    }
    for i in range(12):  # the single device's presence comes from the rule in Python
        one = fleet.admin.get(f"/api/v1/devices/dev-{i:03d}").json()
        assert one["presence"] == by_id[f"dev-{i:03d}"]["presence"]

    def ids(**params: Any) -> list[str]:
        found = [d["id"] for d in listed(fleet, **params)]
        assert [d["id"] for d in paged(fleet, limit=7, **params)] == found
        return found

    def where(keep: Any) -> list[str]:
        return [d["id"] for d in everyone if keep(d)]

    assert ids(model="mlp", model_version=2) == where(
        lambda d: n[d["id"]] % 4 and n[d["id"]] % 3 == 1
    )
    assert ids(model="cnn") == where(lambda d: n[d["id"]] % 7 == 0)
    assert ids(model="cnn", model_version=9) == []
    assert ids(profile="jetson-orin") == where(lambda d: n[d["id"]] % 2 == 0)
    # an operator's label wins over the device's own
    assert ids(label="site=ops") == where(lambda d: n[d["id"]] % 10 == 0)
    assert ids(label="site=s0") == where(lambda d: n[d["id"]] % 5 == 0 and n[d["id"]] % 10)
    assert ids(label=["site=s1", "group=g"], profile="raspberry-pi-5") == where(
        lambda d: n[d["id"]] % 5 == 1 and n[d["id"]] % 2
    )
    for state in ("online", "silent", "offline"):
        assert ids(presence=state) == where(lambda d, s=state: d["presence"] == s)
    # any key, as the operator wrote it (SQLite's JSON paths cannot name these two)
    odd = {'zone "a"': "n°1", "zöne": "b", "site": "s9"}
    resp = fleet.admin.patch("/api/v1/devices/dev-001/labels", json={"labels": odd})
    assert resp.status_code == 200, resp.text
    for key, value in odd.items():
        assert ids(label=f"{key}={value}") == ["dev-001"]
    assert "dev-001" not in ids(label="site=s1")
    assert ids(online="true") == where(lambda d: d["presence"] == "online")
    assert ids(online="false", trust_root_version=2) == where(
        lambda d: d["presence"] != "online" and n[d["id"]] % 2
    )


def counted(devices: list[dict[str, Any]]) -> dict[str, Any]:
    presence: Counter[tuple[str | None, str]] = Counter()
    labels: Counter[tuple[str, str, str]] = Counter()
    versions: Counter[tuple[str, int]] = Counter()
    for d in devices:
        presence[(d["hardware_profile"], d["presence"])] += 1
        for key, value in d["labels"].items():
            labels[(key, value, d["presence"])] += 1
        for m in d["models"]:
            versions[(m["model"], m["version"])] += 1
    launchers = [d.get("launcher") or {} for d in devices]
    return {
        "agents": {
            "degraded": sum(r.get("phase") == "degraded" for r in launchers),
            "rolled_back": sum(
                (r.get("last_update") or {}).get("outcome") == "rolled_back" for r in launchers
            ),
        },
        "presence": [
            {"hardware_profile": p, "presence": s, "devices": c}
            for (p, s), c in sorted(presence.items())
        ],
        "labels": [
            {"key": k, "value": v, "presence": s, "devices": c}
            for (k, v, s), c in sorted(labels.items())
        ],
        "versions": [
            {"model": m, "version": v, "devices": c} for (m, v), c in sorted(versions.items())
        ],
    }


def test_the_summary_counts_what_the_list_holds(fleet: RunningControlPlane) -> None:
    for params in ({}, {"profile": "raspberry-pi-5"}, {"label": "site=ops", "presence": "online"}):
        resp = fleet.admin.get("/api/v1/devices/summary", params=params)
        assert resp.status_code == 200, resp.text
        assert resp.json() == counted(listed(fleet, **params)), params


BAD = [
    ({"limit": 0}, "limit"),
    ({"limit": 1001}, "limit"),
    ({"limit": "ten"}, "limit"),
    ({"limit": 10, "after": "../dev-1"}, "after"),
    ({"limit": 10, "after": "x" * 129}, "after"),
    ({"model_version": 2}, "model_version"),
    ({"label": "site"}, "label"),
]


def test_bad_values_are_400s_naming_the_field(start_control_plane: ControlPlaneFactory) -> None:
    with start_control_plane() as cp:
        for params, field in BAD:
            for path in ("/api/v1/devices", "/api/v1/devices/summary"):
                if path.endswith("summary") and ("limit" in params or "after" in params):
                    continue
                resp = cp.admin.get(path, params=params)
                assert resp.status_code == 400, (path, params, resp.text)
                assert (
                    resp.json()["error"].startswith(f"query.{field}")
                    or field in resp.json()["error"]
                ), (path, params, resp.text)


def test_the_console_pages_devices_through_the_api(fleet: RunningControlPlane) -> None:
    token = (fleet.state_dir / "admin-token").read_text().strip()
    with httpx.Client(base_url=fleet.url, timeout=30) as console:
        assert console.post("/ui/login", data={"token": token}).status_code == 303
        overview = console.get("/ui/")
        assert overview.status_code == 200
        online = sum(1 for i in range(FLEET) if i % 3 and i % 6 != 1)
        assert f"{online} online" in overview.text
        url: str | None = "/ui/devices?model=mlp&profile=raspberry-pi-5"
        seen: list[str] = []
        while url is not None:
            page = console.get(url.replace("&amp;", "&"))
            assert page.status_code == 200, page.text[:300]
            seen += re.findall(r'<a href="/ui/devices/(dev-\d+)">', page.text)
            following = re.search(r'<a rel="next" href="([^"]+)">', page.text)
            url = following.group(1) if following else None
        matching = [f"dev-{i:03d}" for i in range(FLEET) if i % 4 and i % 2]
        assert seen == matching and len(matching) > 50  # pages of 50
        assert (
            f"{len(matching)} devices, page 1 of {-(-len(matching) // 50)}"
            in console.get("/ui/devices?model=mlp&profile=raspberry-pi-5").text
        )
        assert console.get("/ui/devices?model=mlp:two").status_code == 400
        # a rollout's preview counts every match and lists the first 100, one profile or two
        for query in ("", "&profiles=jetson-orin", "&profiles=jetson-orin&profiles=raspberry-pi-5"):
            preview = console.get(f"/ui/rollouts/preview?selector=group=g{query}").text
            count = FLEET if query.count("=") != 1 else FLEET // 2
            assert f"{count} devices</strong> match (the first 100 listed)" in preview
            assert preview.count("<li>") == 100
