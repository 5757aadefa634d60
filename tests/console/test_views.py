"""The console's computations on the API's documents, without a browser."""

from __future__ import annotations

from datetime import UTC, datetime

from control_plane.console import views


def device(i: int, presence: str, profile: str | None, models: list[tuple[str, int]]) -> dict:
    return {
        "id": f"d{i}",
        "presence": presence,
        "hardware_profile": profile,
        "labels": {"site": "a" if i % 2 else "b"},
        "models": [{"model": m, "version": v} for m, v in models],
    }


def test_fleet_counts_by_presence_profile_label_and_version() -> None:
    devices = [
        device(1, "online", "pi", [("mlp", 1)]),
        device(2, "silent", "pi", [("mlp", 2)]),
        device(3, "offline", None, [("mlp", 2), ("cnn", 1)]),
    ]
    counts = views.fleet_counts(devices)
    assert counts.total == {"online": 1, "silent": 1, "offline": 1}
    assert counts.by_profile == {"?": {"offline": 1}, "pi": {"online": 1, "silent": 1}}
    assert counts.by_label == {"site=a": {"online": 1, "offline": 1}, "site=b": {"silent": 1}}
    assert counts.versions == {"cnn": {1: 1}, "mlp": {1: 1, 2: 2}}


def test_the_overview_counts_the_most_common_labels_only() -> None:
    devices = [device(i, "online", "pi", []) | {"labels": {"n": str(i % 30)}} for i in range(300)]
    assert len(views.fleet_counts(devices).by_label) == views.TOP_LABELS


def test_a_page_of_devices_is_clamped_to_the_pages_there_are() -> None:
    items = [{"id": i} for i in range(120)]
    first, last = views.page_of(items, 1), views.page_of(items, 99)
    assert (first.pages, len(first.items), first.items[0]["id"]) == (3, 50, 0)
    assert (last.number, len(last.items), last.items[-1]["id"]) == (3, 20, 119)
    assert views.page_of([], 1).pages == 1


def test_serves_matches_a_model_or_one_of_its_versions() -> None:
    d = device(1, "online", "pi", [("mlp", 2)])
    assert views.serves(d, "mlp") and views.serves(d, "mlp:2")
    assert not views.serves(d, "mlp:1") and not views.serves(d, "cnn")


def window(received_s: float, requests: int, errors: int, p50: float, p99: float) -> dict:
    at = datetime.fromtimestamp(received_s, UTC).isoformat()
    return {"received_at": at, "requests": requests, "errors": errors, "p50_ms": p50, "p99_ms": p99}


def test_history_buckets_windows_into_points_oldest_first() -> None:
    now = 10_000.0
    windows = [  # newest first, as the API gives them
        window(now - 10, 60, 6, 2.0, 9.0),
        window(now - 20, 60, 0, 4.0, 5.0),
        window(now - 130, 120, 0, 1.0, 3.0),
    ]
    points = views.history(windows, now, 60)
    assert [p.t for p in points] == [now - 120, now - 60, now]
    assert [p.requests_per_s for p in points] == [2.0, 0.0, 2.0]
    assert points[1].error_rate is None and points[1].p50_ms is None  # no traffic: a gap
    assert points[2].error_rate == 0.05 and points[2].p50_ms == 3.0 and points[2].p99_ms == 9.0
    assert views.history([], now, 60) == []
