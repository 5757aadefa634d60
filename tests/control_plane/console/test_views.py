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


def event(at: str, state: str, version: int | None = 2, **more: object) -> dict:
    return {
        "model": "mlp",
        "version": version,
        "rollout_id": "rollout-4",
        "state": state,
        "at": f"2026-12-07T10:00:{at}+00:00",
        **more,
    }


def test_the_device_history_collapses_repeated_events_newest_first() -> None:
    events = [  # oldest first, as the API gives them
        event("01", "received"),
        event("02", "received"),
        event("03", "received"),
        event("04", "verified"),
        event("05", "staged"),
        event("06", "staged"),
        event("07", "received"),  # not next to the first three: a row of its own
    ]
    rows = views.history_rows(events)
    assert [(r["state"], r["count"]) for r in rows] == [
        ("received", 1),
        ("staged", 2),
        ("verified", 1),
        ("received", 3),
    ]
    assert rows[-1]["first_at"].endswith("00:01+00:00") and rows[-1]["at"].endswith("00:03+00:00")
    assert rows[0]["what"] == "mlp v2"


def test_an_event_without_a_version_never_reads_vnone() -> None:
    rows = views.history_rows([event("01", "failed", None, reason="no space")])
    assert rows[0]["what"] == "mlp"
    assert views.event_subject({"model": None, "version": None}) == "?"


def test_a_rollout_page_shows_each_waves_shadow_phase_in_the_clis_words() -> None:
    from control_plane.console.rollouts import progress
    from control_plane.status_view import status_lines

    spec = {"sample_share": 0.5, "min_agreement": 0.99, "min_requests": 100, "timeout_s": 60}
    state = {
        "state": "passed",
        "agreement": 0.995,
        "rows": 400,
        "requests": 200,
        "dropped": 3,
        "max_abs_diff": 0.01,
        "latency_ratio": 1.25,
    }
    doc = {
        "id": 4,
        "model": "mlp",
        "version": 2,
        "state": "succeeded",
        "reason": None,
        "current_wave": 1,
        "gates": {},
        "gate_report": {},
        "bake_time_s": 1,
        "waves": [{"wave": 0, "size": "1", "devices": 1, "states": {"committed": 1}}],
        "devices": [],
        "shadow": {"spec": spec, "waves": {"0": state}},
    }
    shown = progress(doc)["waves"][0]["shadow"]
    assert "agreement 99.5% (min 99.0%) over 400 rows" in shown and "3 dropped" in shown
    assert "candidate latency 1.25x" in shown
    assert any(shown in line for line in status_lines(doc))  # the same words as the CLI
    assert any("wave 0 " in line for line in status_lines(doc))  # numbered from 0 there too


def test_the_overview_needs_attention_for_rollbacks_absent_devices_and_drift() -> None:
    now = datetime(2026, 12, 7, 12, tzinfo=UTC)

    def made(i: int, state: str, hours_ago: float) -> dict:
        at = datetime.fromtimestamp(now.timestamp() - hours_ago * 3600, UTC).isoformat()
        reason = "gates: error rate" if state == "rolled_back" else None
        return {
            "id": i,
            "model": "mlp",
            "version": 3,
            "state": state,
            "reason": reason,
            "updated_at": at,
        }

    rollouts = [made(3, "rolled_back", 2), made(2, "succeeded", 1), made(1, "rolled_back", 30)]
    counts = views.fleet_counts(summary(("pi", "online", 2), ("pi", "offline", 1)))
    fleet = {"device_id": "*", "over_threshold": False}
    drifts = [
        {
            "model": "mlp",
            "version": 3,
            "psi_threshold": 0.2,
            "fleet": fleet,
            "devices": [{"over_threshold": True}, {"over_threshold": False}],
        },
        {"model": "mlp", "version": 2, "psi_threshold": 0.2, "fleet": None, "devices": []},
    ]
    alerts = views.attention(counts, rollouts, drifts, now)
    assert [(a.kind, a.href) for a in alerts] == [
        ("rollback", "/ui/rollouts/3"),  # not #1: it rolled back more than a day ago
        ("offline", "/ui/devices?presence=offline"),
        ("drift", "/ui/models/mlp/versions/3"),
    ]
    assert alerts[0].words == "Rollout #3 of mlp v3 rolled back: gates: error rate"
    assert alerts[2].words == "mlp v3: 1 devices' input drift over PSI 0.2"
    assert views.attention(views.fleet_counts(summary()), [], [], now) == []


def test_the_overview_needs_attention_for_concept_drift() -> None:
    now = datetime(2026, 12, 7, 12, tzinfo=UTC)
    counts = views.fleet_counts(summary(("pi", "online", 2)))

    def accuracy(version: int, live: float, over: bool) -> dict:
        drift = {"accuracy": live, "reference_accuracy": 0.98, "drop": 0.98 - live}
        return {
            "model": "digits",
            "version": version,
            "concept_drift": drift | {"over_threshold": over},
        }

    alerts = views.attention(
        counts, [], [], now, [accuracy(2, 0.95, False), accuracy(3, 0.5, True)]
    )
    assert [(a.kind, a.href) for a in alerts] == [("concept_drift", "/ui/models/digits/versions/3")]
    assert alerts[0].words == (
        "digits v3: live accuracy 50.0%, 48.0% below the reference's 98.0% (concept drift)"
    )


def test_a_windows_openings_are_the_control_planes_own() -> None:
    from control_plane.rollouts.windows import Window

    window = Window.of("w", "30 2 * * 1-5", 3600, "Europe/Paris")
    friday = datetime(2026, 12, 4, 12, tzinfo=UTC)
    found = views.openings(window, friday, 3)
    # the weekend skipped; 02:30 in Paris is 01:30 UTC in winter
    assert [d.isoformat() for d in found] == [
        "2026-12-07T01:30:00+00:00",
        "2026-12-08T01:30:00+00:00",
        "2026-12-09T01:30:00+00:00",
    ]
    assert views.openings(Window.of("w", "0 0 31 2 *", 60, "UTC"), friday, 3) == []


def test_the_rollout_form_gives_the_api_its_gates_and_shadow_by_their_names() -> None:
    from control_plane.console.forms import rollout_spec

    form = {
        "model": ["mlp"],
        "version": ["3"],
        "selector": ["site=lab, group=pi"],
        "max_rejections": ["2"],
        "max_drift": ["0.2"],
        "max_accuracy_drop": ["0.05"],
        "skip_self_test": ["on"],
        "shadow_share": ["0.5"],
        "min_agreement": ["0.95"],
        "shadow_min_requests": [""],
    }
    spec = rollout_spec(form)
    assert spec["selector"] == {"site": "lab", "group": "pi"}
    assert spec["gates"] == {
        "allow_unjudged": False,
        "self_test": False,
        "max_rejections": "2",
        "max_drift": "0.2",
        "max_accuracy_drop": "0.05",
    }
    assert spec["shadow"] == {"sample_share": "0.5", "min_agreement": "0.95"}
    # no share, no shadow phase, whatever its other fields say; blank gates keep the defaults
    plain = rollout_spec({"model": ["mlp"], "version": ["3"], "min_agreement": ["0.95"]})
    assert "shadow" not in plain and plain["gates"] == {"allow_unjudged": False}


def test_a_label_form_sets_and_removes_as_the_cli_does() -> None:
    from control_plane.console.edits import label_change
    from control_plane.console.web import BadForm

    form = {"set": ["line=3, cell="], "remove": ["old", " "]}
    assert label_change(form) == {"line": "3", "cell": None, "old": None}
    with pytest.raises(BadForm, match="labels: give key=value"):
        label_change({"set": [""]})


def test_every_rejection_code_has_plain_words() -> None:
    from common.protocol.errors import Rejection

    assert set(views.REJECTION_WORDS) == set(Rejection)  # a new code needs its words here
    rows = views.history_rows([event("01", "rejected", code="bad_signature")])
    assert rows[0]["code_words"] == "the signature does not verify"
    assert views.code_words("from_a_newer_agent") == "from_a_newer_agent"
    assert views.code_words(None) is None


def test_the_overview_needs_attention_for_degraded_and_rolled_back_agents() -> None:
    now = datetime(2026, 12, 7, 12, tzinfo=UTC)
    doc = summary(("pi", "online", 5)) | {"agents": {"degraded": 2, "rolled_back": 1}}
    alerts = views.attention(views.fleet_counts(doc), [], [], now)
    assert [(a.kind, a.href, a.words) for a in alerts] == [
        (
            "agent_degraded",
            "/ui/devices?agent=degraded",
            "2 devices whose agent crash-loops (degraded): restarted, not yet stable",
        ),
        (
            "agent_rolled_back",
            "/ui/devices?agent=rolled_back",
            "1 devices went back from an agent release (rolled back)",
        ),
    ]
    none = summary(("pi", "online", 5)) | {"agents": {"degraded": 0, "rolled_back": 0}}
    assert views.attention(views.fleet_counts(none), [], [], now) == []
