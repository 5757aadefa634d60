"""The console's computations on the API's documents, without a browser."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from control_plane.console import views


def summary(*rows: tuple[str | None, str, int]) -> dict:
    """The API's summary of devices ``(profile, presence, n)``, each serving mlp v1, labelled
    site=a."""
    return {
        "presence": [{"hardware_profile": p, "presence": s, "devices": n} for p, s, n in rows],
        "labels": [{"key": "site", "value": "a", "presence": s, "devices": n} for _, s, n in rows],
        "versions": [{"model": "mlp", "version": 1, "devices": sum(n for _, _, n in rows)}],
    }


def test_fleet_counts_by_presence_profile_label_and_version() -> None:
    doc = summary(("pi", "online", 2), ("pi", "silent", 1), (None, "offline", 3))
    doc["versions"].append({"model": "cnn", "version": 2, "devices": 1})
    counts = views.fleet_counts(doc)
    assert counts.total == {"online": 2, "silent": 1, "offline": 3}
    assert counts.by_profile == {"?": {"offline": 3}, "pi": {"online": 2, "silent": 1}}
    assert counts.by_label == {"site=a": {"online": 2, "silent": 1, "offline": 3}}
    assert counts.versions == {"cnn": {2: 1}, "mlp": {1: 6}}


def test_the_overview_counts_the_most_common_labels_only() -> None:
    doc = summary()
    doc["labels"] = [
        {"key": "n", "value": str(i), "presence": "online", "devices": i} for i in range(30)
    ]
    top = views.fleet_counts(doc).by_label
    assert len(top) == views.TOP_LABELS and "n=29" in top and "n=0" not in top


def test_a_page_counts_the_pages_of_every_match() -> None:
    assert views.Page([], 1, 120, "d49").pages == 3
    assert views.Page([], 1, 0, None).pages == 1


def test_the_model_filter_is_a_model_or_one_of_its_versions() -> None:
    assert views.model_filter("mlp") == ("mlp", None)
    assert views.model_filter("mlp:2") == ("mlp", 2)
    for bad in ("mlp:", "mlp:two", ":2"):
        with pytest.raises(ValueError, match="model: expected model or model:version"):
            views.model_filter(bad)


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
