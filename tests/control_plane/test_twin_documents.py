"""A device's twin document from its groups' and its own (precedence, key by key), and the
diff of what it reports against it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from control_plane.db.models import ConfigTwinRow, Device
from control_plane.twins.documents import diff, merged


def row(i: int, settings: dict[str, Any], app: dict[str, Any], **target: Any) -> ConfigTwinRow:
    return ConfigTwinRow(
        id=i,
        target=str(i),
        device_id=target.get("device"),
        selector=target.get("selector", {}),
        settings=settings,
        app=app,
        updated_by="op",
        updated_at=datetime.now(UTC),
    )


def test_the_device_wins_then_the_group_of_more_labels() -> None:
    device = Device(id="d1", reported_labels={"site": "lab", "group": "pi"}, operator_labels={})
    rows = [
        row(3, {"log_level": "ERROR"}, {"a": 2}, selector={"site": "lab", "group": "pi"}),
        row(
            1,
            {"log_level": "INFO", "telemetry_interval_s": 9},
            {"a": 1, "b": 1},
            selector={"site": "lab"},
        ),
        row(2, {"log_level": "DEBUG"}, {"z": 0}, selector={"site": "elsewhere"}),
        row(4, {"telemetry_interval_s": 2}, {"b": 3}, device="d1"),
        row(5, {"telemetry_interval_s": 7}, {}, device="d2"),
    ]
    assert merged(rows, device) == (
        {"log_level": "ERROR", "telemetry_interval_s": 2},
        {"a": 2, "b": 3},
    )


def test_the_diff_names_each_key_not_in_effect_and_why() -> None:
    desired = {
        "version": 4,
        "settings": {"log_level": "DEBUG", "max_request_bytes": 10, "turbo": True, "x": 1},
        "app": {"k": "v"},
    }
    assert [d["state"] for d in diff(desired, None)] == ["differs"] * 5
    report = {
        "version": 4,
        "reported": {"log_level": "DEBUG", "max_request_bytes": 99, "x": 1, "app": {"k": "v"}},
        "pending_restart": {"max_request_bytes": 10},
        "rejected": {"turbo": "unknown setting"},
    }
    assert {d["key"]: d["state"] for d in diff(desired, report)} == {
        "max_request_bytes": "pending_restart",
        "turbo": "rejected",
    }
    in_sync = {
        **report,
        "reported": {**report["reported"], "max_request_bytes": 10},
        "pending_restart": {},
        "rejected": {},
    }
    assert (
        diff(
            {**desired, "settings": {"log_level": "DEBUG", "max_request_bytes": 10, "x": 1}},
            in_sync,
        )
        == []
    )
    assert [d["key"] for d in diff(desired | {"version": 5, "settings": {}}, in_sync)] == [
        "version"
    ]
