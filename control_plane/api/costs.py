"""Cost routes: the devices' hourly rates (``PUT``/``GET /api/v1/cost-rates``) and what a
version cost per thousand predictions (``GET /api/v1/models/{name}/versions/{version}/cost``);
the arithmetic is :mod:`control_plane.quality.cost`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from control_plane.api import audit
from control_plane.api.body import json_body, json_request
from control_plane.api.deps import OPERATOR, SESSION, VERSION, VIEWER, Services, json_response
from control_plane.db.models import NAME_LENGTH, CostRate
from control_plane.quality.cost import DEFAULT_KEY, RateBook, RateKind, version_cost
from control_plane.registry.store import get_version
from control_plane.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["Cost"])


def attach(app: FastAPI, svc: Services) -> None:
    """The rates ingest charges each window by (run by the app's lifespan), and the routes."""
    book = RateBook(svc.sessions)
    svc.ingestor.rate_of = book.rate_of
    app.state.rates = book
    app.include_router(router)


MAX_WINDOW_S = 30 * 86400.0


class RateSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    label: str | None = Field(
        default=None, pattern=r"^[^=]{1,128}=[^=]{1,128}$", max_length=2 * NAME_LENGTH + 1
    )
    """``name=value``: the devices with this label."""
    profile: str | None = Field(default=None, min_length=1, max_length=NAME_LENGTH)
    """The devices of this hardware profile; neither ``label`` nor ``profile``: the default."""
    per_hour: float = Field(ge=0, le=1e6)
    """What an hour of such a device costs, in the operator's currency."""

    @model_validator(mode="after")
    def _one_target(self) -> RateSpec:
        if self.label is not None and self.profile is not None:
            raise ValueError("a rate is for a label or for a profile, not both")
        return self

    @property
    def kind_key(self) -> tuple[RateKind, str]:
        if self.label is not None:
            return RateKind.LABEL, self.label
        if self.profile is not None:
            return RateKind.PROFILE, self.profile
        return RateKind.DEFAULT, DEFAULT_KEY


class RatesSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rates: list[RateSpec] = Field(max_length=1000)

    @model_validator(mode="after")
    def _distinct(self) -> RatesSpec:
        seen = set()
        for i, rate in enumerate(self.rates):
            if rate.kind_key in seen:
                kind, key = rate.kind_key
                raise ValueError(f"rates[{i}]: a second rate for {kind} {key}")
            seen.add(rate.kind_key)
        return self


NEW_RATES = json_body(RatesSpec, OPERATOR)


def rate_doc(row: CostRate) -> dict[str, Any]:
    doc: dict[str, Any] = {"per_hour": row.per_hour}
    if row.kind != RateKind.DEFAULT:
        doc[row.kind] = row.key
    return doc | {"updated_by": row.updated_by}


async def _rates(s: AsyncSession) -> list[dict[str, Any]]:
    rows = (await s.execute(select(CostRate).order_by(CostRate.kind, CostRate.key))).scalars()
    return [rate_doc(r) for r in rows]


@router.put(
    "/cost-rates",
    summary="Set every device cost rate (per hour, by label, profile or default)",
    openapi_extra=json_request(RatesSpec),
)
async def set_rates(
    request: Request,
    spec: RatesSpec = NEW_RATES,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    now = datetime.now(UTC)
    await s.execute(delete(CostRate))
    for rate in spec.rates:
        kind, key = rate.kind_key
        s.add(
            CostRate(
                kind=kind, key=key, per_hour=rate.per_hour, updated_by=who.name, updated_at=now
            )
        )
    audit.record(s, who.name, "cost.rates", "cost-rates", rates=spec.model_dump()["rates"])
    await s.commit()
    rates: RateBook = request.app.state.rates
    rates.changed()  # ingest charges by the new rates from its next read
    return json_response({"rates": await _rates(s)})


@router.get("/cost-rates", summary="The device cost rates")
async def list_rates(s: AsyncSession = SESSION, _: Principal = VIEWER) -> Response:
    return json_response({"rates": await _rates(s)})


@router.get(
    "/models/{name}/versions/{version}/cost",
    summary="Cost per thousand predictions of a version, over the last window_s",
)
async def show_cost(
    name: str,
    version: int = VERSION,
    window_s: float = Query(default=3600.0, gt=0, le=MAX_WINDOW_S),
    s: AsyncSession = SESSION,
    _: Principal = VIEWER,
) -> Response:
    since = datetime.now(UTC) - timedelta(seconds=window_s)
    doc = await version_cost(s, name, version, since)
    if not doc["devices"] and not doc["unpriced_devices"]:
        # a device's own model (not in the registry) has a cost too, once it reported
        await get_version(s, name, version)  # 404 for a version neither knows
    return json_response(doc | {"window_s": window_s})
