"""The device list's filters and the fleet's counts as SQL, on SQLite and PostgreSQL alike.

Everything the device list filters on is decided by the database, so a page of 100 devices
out of 20,000 reads about 100 rows (keyset pagination on ``devices.id``, its primary key):

- profile, trust root version: plain columns;
- labels: the operator's value of a key, else the device's own (``Device.labels``): PostgreSQL's
  ``->>``, SQLite's ``json_each`` over the two merged (``json_patch``);
- the served model (and version): an ``EXISTS`` over the elements of ``devices.models``
  (``json_each`` on SQLite, ``json_array_elements`` on PostgreSQL);
- presence: :class:`~control_plane.ingest.presence.SilenceRule` written as a ``CASE``: the same
  limit (the larger of the timeout and three announced intervals, plus the resolution),
  compared with the age of ``last_seen`` (``julianday`` on SQLite, ``EXTRACT(EPOCH ...)`` on
  PostgreSQL) and with how long the control plane has been hearing (a constant).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Float,
    String,
    and_,
    case,
    cast,
    exists,
    func,
    literal,
    or_,
    select,
    true,
)
from sqlalchemy import column as sa_column
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from control_plane.db.models import Device
from control_plane.ingest.presence import SILENT_INTERVALS, Presence, SilenceRule


class age_s(FunctionElement[float]):  # noqa: N801 (a SQL function, named like one)
    """Seconds from a timestamp column to a given instant: ``age_s(column, now)``."""

    type = Float()
    inherit_cache = True


@compiles(age_s, "sqlite")
def _age_sqlite(element: age_s, compiler: SQLCompiler, **kw: Any) -> str:
    column, now = (compiler.process(c, **kw) for c in element.clauses)
    # SQLite keeps timestamps as text in UTC; julianday() reads the fraction of a second too
    return f"((julianday({now}) - julianday({column})) * 86400.0)"


@compiles(age_s, "postgresql")
def _age_postgresql(element: age_s, compiler: SQLCompiler, **kw: Any) -> str:
    column, now = (compiler.process(c, **kw) for c in element.clauses)
    return f"EXTRACT(EPOCH FROM ({now} - {column}))"


def presence_sql(
    rule: SilenceRule, now: datetime, hearing_since: datetime | None
) -> ColumnElement[str]:
    """A device's presence at ``now``, as :meth:`SilenceRule.presence` decides it."""
    if rule.timeout_s <= 0 or hearing_since is None:
        return case((Device.online, Presence.ONLINE.value), else_=Presence.OFFLINE.value)
    intervals = func.coalesce(Device.telemetry_interval_s, 0.0) * SILENT_INTERVALS
    limit_s = (
        case((intervals > rule.timeout_s, intervals), else_=rule.timeout_s) + rule.resolution_s
    )
    # silent: nothing heard for longer than the limit, neither the device (its last_seen)
    # nor anything at all (the control plane was deaf until hearing_since)
    heard_for_s = (now - hearing_since).total_seconds()
    when = literal(now, DateTime(timezone=True))
    silent = and_(
        literal(heard_for_s, Float()) > limit_s,
        or_(Device.last_seen.is_(None), age_s(Device.last_seen, when) > limit_s),
    )
    return case(
        (~Device.online, Presence.OFFLINE.value),
        (silent, Presence.SILENT.value),
        else_=Presence.ONLINE.value,
    )


def label_sql(dialect: str, key: str, value: str) -> ColumnElement[bool]:
    """The device's label ``key`` is ``value``: the operator's, else its own."""
    if dialect == "sqlite":
        # NOTE: not json_extract: SQLite's JSON paths cannot name every key (one with a double
        # quote, or written with a \\u escape as SQLAlchemy writes non-ASCII ones)
        pairs = _labels(dialect)
        return exists(
            select(1).select_from(pairs).where(pairs.c.key == key, pairs.c.value == value)
        )
    own = Device.reported_labels.op("->>")(key)
    operators = Device.operator_labels.op("->>")(key)
    return func.coalesce(operators, own) == value


def _elements(dialect: str) -> Any:
    """The elements of ``devices.models``, one row (column ``value``) each."""
    fn = func.json_each if dialect == "sqlite" else func.json_array_elements
    return fn(Device.models).table_valued("value").alias("served")


def _field(dialect: str, element: Any, name: str) -> ColumnElement[Any]:
    if dialect == "sqlite":
        return func.json_extract(element, f"$.{name}")
    return element.op("->>")(name)  # type: ignore[no-any-return]


def serves_sql(dialect: str, model: str, version: int | None) -> ColumnElement[bool]:
    """The device serves ``model`` (that ``version``, if given)."""
    served = _elements(dialect)
    wanted = [_field(dialect, served.c.value, "model") == model]
    if version is not None:
        # SQLite reads the JSON number as an integer; PostgreSQL's ->> gives text
        wanted.append(
            _field(dialect, served.c.value, "version")
            == (version if dialect == "sqlite" else str(version))
        )
    return exists(select(1).select_from(served).where(*wanted))


class AgentState(StrEnum):
    """What a device's launcher last said of its agent (``DeviceStatus.launcher``)."""

    DEGRADED = "degraded"
    """The agent crash-loops: restarted, not yet stable."""
    ROLLED_BACK = "rolled_back"
    """The last agent release put on trial went back to the previous one."""


def agent_sql(dialect: str, state: AgentState) -> ColumnElement[bool]:
    if state is AgentState.DEGRADED:
        return _field(dialect, Device.launcher, "phase") == "degraded"
    outcome: ColumnElement[Any] = (
        func.json_extract(Device.launcher, "$.last_update.outcome")
        if dialect == "sqlite"
        else Device.launcher.op("->")("last_update").op("->>")("outcome")
    )
    return outcome == "rolled_back"


@dataclass(frozen=True)
class DeviceFilter:
    """What the device list and the summary filter on (all optional)."""

    labels: dict[str, str]
    profile: str | None = None
    trust_root_version: int | None = None
    online: bool | None = None
    presence: Presence | None = None
    model: str | None = None
    model_version: int | None = None
    agent: AgentState | None = None

    def where(self, dialect: str, presence: ColumnElement[str]) -> list[ColumnElement[bool]]:
        out = [label_sql(dialect, k, v) for k, v in self.labels.items()]
        if self.profile is not None:
            out.append(Device.hardware_profile == self.profile)
        if self.trust_root_version is not None:
            out.append(Device.trust_root_version == self.trust_root_version)
        if self.online is not None:
            is_online = presence == Presence.ONLINE.value
            out.append(is_online if self.online else ~is_online)
        if self.presence is not None:
            out.append(presence == self.presence.value)
        if self.model is not None:
            out.append(serves_sql(dialect, self.model, self.model_version))
        if self.agent is not None:
            out.append(agent_sql(dialect, self.agent))
        return out


async def summary(
    s: Any, where: list[ColumnElement[bool]], presence: ColumnElement[str]
) -> dict[str, Any]:
    """Counts of the devices ``where`` selects: by profile and presence, by label and presence,
    by served model version, and those whose agent is degraded or went back from a release.
    Each is one query; no device row leaves the database."""
    dialect = s.get_bind().dialect.name
    p = presence.label("presence")
    by_profile = await s.execute(
        select(Device.hardware_profile, p, func.count())
        .where(*where)
        .group_by(Device.hardware_profile, p)
        .order_by(Device.hardware_profile, p)
    )
    pairs = _labels(dialect)
    labels = await s.execute(
        select(pairs.c.key, pairs.c.value, p, func.count())
        .select_from(Device)
        .join(pairs, true())
        .where(*where)
        .group_by(pairs.c.key, pairs.c.value, p)
        .order_by(pairs.c.key, pairs.c.value, p)
    )
    served = _elements(dialect)
    model, version = (
        _field(dialect, served.c.value, "model"),
        _field(dialect, served.c.value, "version"),
    )
    versions = await s.execute(
        select(model, version, func.count())
        .select_from(Device)
        .join(served, true())
        .where(*where)
        .group_by(model, version)
    )
    agents = {
        state.value: (
            await s.execute(select(func.count()).where(*where, agent_sql(dialect, state)))
        ).scalar_one()
        for state in AgentState
    }
    return {
        "agents": agents,
        "presence": [
            {"hardware_profile": hp, "presence": st, "devices": n} for hp, st, n in by_profile
        ],
        "labels": [
            {"key": k, "value": str(v), "presence": st, "devices": n} for k, v, st, n in labels
        ],
        "versions": sorted(
            ({"model": m, "version": int(v), "devices": n} for m, v, n in versions),
            key=lambda r: (r["model"], r["version"]),
        ),
    }


def _labels(dialect: str) -> Any:
    """The device's labels as (key, value) rows: its own, overridden by the operator's (a
    JSON merge: ``json_patch`` on SQLite, ``jsonb ||`` on PostgreSQL), values as text."""
    key, value = sa_column("key", String()), sa_column("value", String())
    if dialect == "sqlite":
        patched = func.json_patch(Device.reported_labels, Device.operator_labels)
        return func.json_each(patched).table_valued(key, value).alias("label")
    merged = cast(Device.reported_labels, JSONB).op("||")(cast(Device.operator_labels, JSONB))
    return func.jsonb_each_text(merged).table_valued(key, value).alias("label")
