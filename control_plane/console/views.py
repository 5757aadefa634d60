"""What the pages show, computed from the API's documents: the fleet's counts, a page of
devices, a model version's telemetry in chart points. Pure functions, tested without a browser."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from common.protocol.errors import Rejection
from control_plane.db.states import ACTIVE
from control_plane.ingest.presence import Presence
from control_plane.rollouts.windows import Window

PAGE_SIZE = 50
"""Devices on one page of the device list."""
TOP_LABELS = 20
"""Label values the overview counts, the most common first."""


@dataclass(frozen=True)
class FleetCounts:
    """Devices by presence, per hardware profile and per label (key=value)."""

    total: Counter[str]
    by_profile: dict[str, Counter[str]]
    by_label: dict[str, Counter[str]]
    versions: dict[str, Counter[int]]
    """Devices serving each version, per model."""
    agents: Counter[str] = field(default_factory=Counter)
    """Devices whose agent is ``degraded`` or went back from a release (``rolled_back``)."""


AGENT_STATES = ("degraded", "rolled_back")
"""The devices page's ``agent`` filter (the API's ``AgentState``)."""


def fleet_counts(summary: dict[str, Any]) -> FleetCounts:
    """The overview's tables, from the API's ``/api/v1/devices/summary`` (its GROUP BYs)."""
    total: Counter[str] = Counter()
    by_profile: defaultdict[str, Counter[str]] = defaultdict(Counter)
    by_label: defaultdict[str, Counter[str]] = defaultdict(Counter)
    versions: defaultdict[str, Counter[int]] = defaultdict(Counter)
    for row in summary["presence"]:
        total[row["presence"]] += row["devices"]
        by_profile[row["hardware_profile"] or "?"][row["presence"]] += row["devices"]
    for row in summary["labels"]:
        by_label[f"{row['key']}={row['value']}"][row["presence"]] += row["devices"]
    for row in summary["versions"]:
        versions[row["model"]][row["version"]] += row["devices"]
    common = sorted(by_label, key=lambda k: (-sum(by_label[k].values()), k))[:TOP_LABELS]
    return FleetCounts(
        total,
        dict(sorted(by_profile.items())),
        {k: by_label[k] for k in sorted(common)},
        {m: Counter(dict(sorted(v.items()))) for m, v in sorted(versions.items())},
        Counter(summary.get("agents", {})),
    )


def active_rollouts(rollouts: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rollouts if r["state"] in ACTIVE]


def model_filter(model_version: str) -> tuple[str, int | None]:
    """``model`` or ``model:version``, as the API's ``model`` and ``model_version``."""
    model, sep, version = model_version.partition(":")
    if not model or (sep and not version.isdigit()):
        raise ValueError(f"model: expected model or model:version, got {model_version!r}")
    return model, int(version) if sep else None


@dataclass(frozen=True)
class Page:
    """One page of the device list, as the API paged it (keyset, on the device id)."""

    items: list[dict[str, Any]]
    number: int
    total: int
    """Devices that match, on every page."""
    next_after: str | None
    """The API's cursor for the next page (none: this is the last)."""
    size: int = PAGE_SIZE

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))


PRESENCES = [p.value for p in Presence]


@dataclass(frozen=True)
class Point:
    """One chart point: a bucket of a model version's telemetry windows."""

    t: float
    """Unix seconds at the bucket's end."""
    requests_per_s: float
    error_rate: float | None
    p50_ms: float | None
    p99_ms: float | None


def point(t: float, windows: Sequence[dict[str, Any]], span_s: float) -> Point:
    """The windows received in one bucket of ``span_s`` seconds: requests a second, errors per
    request, the median of the devices' p50s and the largest p99 (the gate's worst case)."""
    requests = sum(w["requests"] for w in windows)
    errors = sum(w["errors"] for w in windows)
    p50s = [w["p50_ms"] for w in windows if w["p50_ms"] is not None and w["requests"]]
    p99s = [w["p99_ms"] for w in windows if w["p99_ms"] is not None and w["requests"]]
    return Point(
        t,
        requests / span_s,
        errors / requests if requests else None,
        statistics.median(p50s) if p50s else None,
        max(p99s) if p99s else None,
    )


def history(windows: Sequence[dict[str, Any]], now_s: float, span_s: float) -> list[Point]:
    """Buckets of ``span_s`` seconds ending at ``now_s``, oldest first, from windows newest
    first. When the API's page held fewer windows than the hour had (``limit`` reached), the
    buckets start at the oldest window given: an older bucket would be undercounted."""
    buckets: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
    for w in windows:
        received = datetime.fromisoformat(w["received_at"]).timestamp()
        buckets[int((now_s - received) // span_s)].append(w)
    if not buckets:
        return []
    oldest = max(buckets)
    return [point(now_s - i * span_s, buckets.get(i, []), span_s) for i in range(oldest, -1, -1)]


EVENT_KEY = ("model", "version", "rollout_id", "state", "code", "reason")
"""What makes two update events the same row of a device's history: progress and times
may differ (a download's bytes, an agent reporting ``staged`` again after a reconnect)."""


def history_rows(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A device's update history, newest first, each run of consecutive identical events
    (``received``/``verified``/``staged`` reported again) one row with its ``count`` and its
    first time; ``what`` names the model and version, and leaves out a version there is none
    of (never ``vNone``)."""
    rows: list[dict[str, Any]] = []
    for e in events:  # oldest first, as the API gives them
        key = tuple(e.get(k) for k in EVENT_KEY)
        if rows and rows[-1]["key"] == key:
            rows[-1] |= {"count": rows[-1]["count"] + 1, "last": e}
            continue
        rows.append({"key": key, "count": 1, "first_at": e["at"], "last": e})
    return [
        {
            **r["last"],
            "count": r["count"],
            "first_at": r["first_at"],
            "what": event_subject(r["last"]),
            "code_words": code_words(r["last"].get("code")),
        }
        for r in reversed(rows)
    ]


def event_subject(e: dict[str, Any]) -> str:
    """``mlp v2``, ``mlp`` when the event names no version, ``?`` when it names no model."""
    model, version = e.get("model"), e.get("version")
    if version is None:
        return model or "?"
    return f"{model or '?'} v{version}"


def openings(window: Window, now: datetime, count: int) -> list[datetime]:
    """The next ``count`` openings of ``window`` after ``now``, in UTC (fewer when it opens
    fewer times within the window code's search horizon)."""
    found: list[datetime] = []
    while len(found) < count and (start := window.next_start(found[-1] if found else now)):
        found.append(start)
    return found


ROLLBACK_HORIZON = timedelta(days=1)
"""How far back the overview lists rollouts that rolled back."""


@dataclass(frozen=True)
class Alert:
    """One line of the overview's "needs attention" list, and the page that explains it."""

    kind: str
    words: str
    href: str


def attention(
    counts: FleetCounts,
    rollouts: Iterable[dict[str, Any]],
    drifts: Iterable[dict[str, Any]],
    now: datetime,
    accuracies: Iterable[dict[str, Any]] = (),
) -> list[Alert]:
    """What an operator should look at first: rollouts that rolled back in the last day (of
    those given, the newest first), offline and silent devices, model versions whose input
    drift is over the threshold (the fleet's, or a device's), and those whose live accuracy
    fell past the concept-drift threshold below their reference's."""
    alerts = [
        Alert(
            "rollback",
            f"Rollout #{r['id']} of {r['model']} v{r['version']} "
            f"{r['state'].replace('_', ' ')}" + (f": {r['reason']}" if r["reason"] else ""),
            f"/ui/rollouts/{r['id']}",
        )
        for r in rollouts
        if r["state"] in ("rolled_back", "rolling_back")
        and now - datetime.fromisoformat(r["updated_at"]) <= ROLLBACK_HORIZON
    ]
    for presence, meaning in (
        ("offline", "offline (a clean shutdown or a lost connection)"),
        ("silent", "silent: online by their status, but nothing heard from them"),
    ):
        if n := counts.total[presence]:
            alerts.append(
                Alert(presence, f"{n} devices {meaning}", f"/ui/devices?presence={presence}")
            )
    for state, meaning in (
        ("degraded", "whose agent crash-loops (degraded): restarted, not yet stable"),
        ("rolled_back", "went back from an agent release (rolled back)"),
    ):
        if n := counts.agents[state]:
            alerts.append(
                Alert(f"agent_{state}", f"{n} devices {meaning}", f"/ui/devices?agent={state}")
            )
    for d in drifts:
        over = [x for x in d["devices"] if x["over_threshold"]]
        fleet_over = bool(d["fleet"] and d["fleet"]["over_threshold"])
        if fleet_over or over:
            where = "the fleet's" if fleet_over else f"{len(over)} devices'"
            alerts.append(
                Alert(
                    "drift",
                    f"{d['model']} v{d['version']}: {where} input drift over PSI "
                    f"{d['psi_threshold']:g}",
                    f"/ui/models/{d['model']}/versions/{d['version']}",
                )
            )
    for a in accuracies:
        drift = a["concept_drift"]
        if drift["over_threshold"]:
            alerts.append(
                Alert(
                    "concept_drift",
                    f"{a['model']} v{a['version']}: live accuracy {drift['accuracy']:.1%}, "
                    f"{drift['drop']:.1%} below the reference's "
                    f"{drift['reference_accuracy']:.1%} (concept drift)",
                    f"/ui/models/{a['model']}/versions/{a['version']}",
                )
            )
    return alerts


REJECTION_WORDS = {
    Rejection.MALFORMED: "the message could not be read",
    Rejection.UNSUPPORTED_SCHEMA: "the device does not know this message's schema version",
    Rejection.UNKNOWN_KEY: "signed with a key the device's trust root does not hold",
    Rejection.REVOKED_KEY: "signed with a key the trust root revoked",
    Rejection.BAD_SIGNATURE: "the signature does not verify",
    Rejection.INSUFFICIENT_SIGNATURES: "too few valid signatures for the trust root's threshold",
    Rejection.EXPIRED: "the manifest had expired (check the device's clock)",
    Rejection.NOT_YET_VALID: "the manifest is not valid yet (check the device's clock)",
    Rejection.REPLAYED: "not newer than what the device already holds (a replay)",
    Rejection.WRONG_TARGET: "the manifest is for another device",
    Rejection.NO_ARTIFACT: "no artifact for this device's hardware profile",
    Rejection.DIGEST_MISMATCH: "a downloaded file's digest differs from the manifest's",
    Rejection.SIZE_MISMATCH: "a downloaded file's size differs from the manifest's",
    Rejection.OVERSIZE: "larger than the device's limit (a message or a file)",
    Rejection.DOWNLOAD_FAILED: "the download failed",
    Rejection.DISK_FULL: "the device's disk is full",
    Rejection.LOAD_FAILED: "the model would not load on the device",
    Rejection.SELF_TEST_FAILED: "the version failed its self-test on the device",
    Rejection.HEALTH_CHECK_FAILED: "the version failed its health window on the device",
    Rejection.FLEET_COMMAND: "the control plane asked for it (a rollback or an abort)",
    Rejection.NOTHING_TO_ROLL_BACK: "there was no earlier version to go back to",
    Rejection.SUPERSEDED: "a newer update replaced this one",
    Rejection.NO_LAUNCHER: "the agent does not run under the launcher, so it cannot update itself",
}
"""Each code a device reports with a rejection or a rollback, in plain words."""


def code_words(code: str | None) -> str | None:
    """A rejection code in plain words (an unknown code as it came: a newer agent's)."""
    if not code:
        return None
    try:
        return REJECTION_WORDS[Rejection(code)]
    except ValueError:
        return code
