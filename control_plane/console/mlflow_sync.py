"""``edgefleet models sync NAME --from models:/REGISTERED@ALIAS`` from the browser, one check:
the MLflow version the alias (or the URI's version) points at becomes NAME's next version and
is validated, unless a version of NAME came from it already (then the form says so).

The control plane's own process resolves the URI, against the registry its
``MLFLOW_TRACKING_URI`` names, with the ``edgefleet[mlflow]`` extra (the CLI resolves on the
operator's machine instead); the staged files go up through the API with the operator's
token, as the file upload's do. A following loop (``--interval-s``) stays the CLI's.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from control_plane.console.api import ApiRefused
from control_plane.console.forms import one
from control_plane.console.uploads import upload_version, version_page
from control_plane.console.web import OPERATOR, BadForm, Operator, form, redirect, render
from control_plane.registry.mlflow_source import (
    MlflowRegistry,
    MlflowSourceError,
    ModelRef,
    Staged,
    pushed_from,
    source_line,
)

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.post("/models/sync")
async def sync(request: Request, who: Operator = OPERATOR) -> Response:
    fields = await form(request, who)
    values = {"sync_name": one(fields, "name"), "source": one(fields, "source")}
    try:
        where, notice = await _check(who, values["sync_name"], values["source"])
    except (BadForm, ApiRefused) as exc:
        error = f"{exc.status}: {exc.message}"
        return render(request, "model_new.html", who, exc.status, error=error, values=values)
    if notice:
        return render(request, "model_new.html", who, notice=notice, notice_href=where, values={})
    return redirect(where)


async def _check(who: Operator, name: str, uri: str) -> tuple[str, str]:
    """The page to go to, and what to say instead when NAME is up to date."""
    if not name:
        raise BadForm(400, "name: the model to push the MLflow version as")
    try:
        ref = ModelRef.parse(uri)
        registry = await run_in_threadpool(MlflowRegistry, os.environ.get("MLFLOW_TRACKING_URI"))
        found = await run_in_threadpool(registry.resolve, ref)
    except MlflowSourceError as exc:
        raise BadForm(400, f"source: {exc.message}") from None
    versions = await _versions(who, name)
    done = pushed_from(versions, found)
    if done is not None:
        said = f"{name} is up to date: v{done['version']} is {source_line(done['source'])}"
        return version_page(name, done["version"]), said
    number = max((v["version"] for v in versions), default=0) + 1
    with tempfile.TemporaryDirectory(prefix="edgefleet-mlflow-") as scratch:
        try:
            staged: Staged = await run_in_threadpool(registry.stage, ref, found, Path(scratch))
        except MlflowSourceError as exc:
            raise BadForm(400, f"source: {exc.message}") from None
        await upload_version(who, name, number, staged.variants, source=staged.source)
    await who.api.call("POST", f"/api/v1/models/{quote(name, safe='')}/versions/{number}/validate")
    return version_page(name, number), ""


async def _versions(who: Operator, name: str) -> list[dict[str, Any]]:
    models = await who.api.get("/api/v1/models", archived="true")
    found = next((m for m in models if m["name"] == name), None)
    return list((found or {}).get("versions", []))
