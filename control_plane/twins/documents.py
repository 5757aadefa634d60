"""Each device's config twin: merged from the twins of the label groups it belongs to and its
own, signed into ``Device.desired[TWIN_KEY]`` with a per-device version, and compared with
what the device reports.

Precedence, key by key: a group twin of fewer labels, then one of more (more specific wins;
equal ones in the order they were created), then the device's own. Application keys merge
the same way, one key at a time.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from common.protocol.twin import TWIN_KEY, ConfigTwin
from control_plane.db.models import ConfigTwinRow, Device
from control_plane.signing.keys import KeyRing


def target_of(device_id: str | None, selector: dict[str, str]) -> str:
    if device_id is not None:
        return f"device:{device_id}"
    return "labels:" + ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def merged(rows: list[ConfigTwinRow], device: Device) -> tuple[dict[str, Any], dict[str, Any]]:
    """``device``'s settings and application keys, by the precedence above."""
    labels = device.labels
    groups = [
        r
        for r in rows
        if r.device_id is None and all(labels.get(k) == v for k, v in r.selector.items())
    ]
    groups.sort(key=lambda r: (len(r.selector), r.id))
    own = [r for r in rows if r.device_id == device.id]
    settings: dict[str, Any] = {}
    app: dict[str, Any] = {}
    for row in groups + own:
        settings |= row.settings
        app |= row.app
    return settings, app


async def sync(session: AsyncSession, keys: KeyRing, only: list[str] | None = None) -> list[Device]:
    """Sign a new twin for every device (of ``only``) whose merged document changed; those
    devices (to publish their desired state once committed)."""
    rows = list((await session.execute(select(ConfigTwinRow))).scalars())
    query = select(Device).with_for_update()
    if only is not None:
        query = query.where(Device.id.in_(only))
    devices = (await session.execute(query)).scalars()
    now = datetime.now(UTC)
    changed = []
    for device in devices:
        settings, app = merged(rows, device)
        current = (device.desired or {}).get(TWIN_KEY)
        signed = current["signed"] if current else None
        if signed is None and not settings and not app:
            continue
        if signed is not None and signed["settings"] == settings and signed["app"] == app:
            continue
        device.twin_version = (device.twin_version or 0) + 1
        twin = ConfigTwin(
            kind="config_twin",
            device_id=device.id,
            version=device.twin_version,
            settings=settings,
            app=app,
            issued_at=now,
        )
        device.desired = {**(device.desired or {}), TWIN_KEY: keys.sign_message(twin)}
        changed.append(device)
    return changed


def twin_view(device: Device) -> dict[str, Any]:
    """Desired against reported, and the differences (empty: the device runs its twin)."""
    current = (device.desired or {}).get(TWIN_KEY)
    desired = current["signed"] if current else None
    reported = device.twin_reported
    return {
        "device_id": device.id,
        "desired": None
        if desired is None
        else {k: desired[k] for k in ("version", "settings", "app")},
        "reported": reported,
        "diff": diff(desired, reported),
    }


def diff(desired: dict[str, Any] | None, reported: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One entry per key whose desired value is not the one in effect on the device, with
    why: ``rejected`` (and the device's reason), ``pending_restart``, or ``differs`` (not
    applied yet: the device is offline, or has not received this version)."""
    if desired is None:
        return []
    rep = reported or {}
    values = rep.get("reported", {})
    pending, rejected = rep.get("pending_restart", {}), rep.get("rejected", {})
    out: list[dict[str, Any]] = []

    def entry(key: str, want: Any, have: Any, state: str, reason: str | None = None) -> None:
        item = {"key": key, "desired": want, "reported": have, "state": state}
        out.append(item | ({"reason": reason} if reason else {}))

    for key, want in sorted(desired["settings"].items()):
        have = values.get(key)
        if key in rejected:
            entry(key, want, have, "rejected", rejected[key])
        elif key in pending and pending[key] == want:
            entry(key, want, have, "pending_restart")
        elif key not in values or have != want:
            entry(key, want, have, "differs")
    app_want, app_have = desired["app"], values.get("app", {})
    for key in sorted(set(app_want) | set(app_have)):
        if app_want.get(key) != app_have.get(key):
            state = "rejected" if "app" in rejected else "differs"
            entry(f"app.{key}", app_want.get(key), app_have.get(key), state, rejected.get("app"))
    if not out and rep.get("version") != desired["version"]:
        entry("version", desired["version"], rep.get("version"), "differs")
    return out
