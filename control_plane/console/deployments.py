"""Deployment pages: the list with each one's compliance, the form that creates one, one
deployment's devices, the change of its version, its pause and resume, and its deletion. Each
change is the API's own route (``control_plane.api.deployments``), called with the operator's
token."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.responses import Response

from control_plane.console.api import ApiRefused
from control_plane.console.forms import one, rollout_spec
from control_plane.console.web import (
    OPERATOR,
    BadForm,
    Operator,
    confirmation,
    form,
    redirect,
    render,
)

router = APIRouter(prefix="/ui", include_in_schema=False)


def _path(name: str) -> str:
    return f"/api/v1/deployments/{quote(name, safe='')}"


async def _list_page(
    request: Request, who: Operator, status: int = 200, **context: Any
) -> Response:
    found = await who.api.get("/api/v1/deployments")
    models = await who.api.get("/api/v1/models")
    context.setdefault("values", {})
    return render(
        request, "deployments.html", who, status, deployments=found, models=models, **context
    )


@router.get("/deployments")
async def deployments(request: Request, who: Operator = OPERATOR) -> Response:
    return await _list_page(request, who)


@router.post("/deployments")
async def create(request: Request, who: Operator = OPERATOR) -> Response:
    fields = await form(request, who)
    try:
        spec = rollout_spec(fields) | {"name": one(fields, "name")}
        if priority := one(fields, "priority"):
            spec["priority"] = priority
        doc = await who.api.call("POST", "/api/v1/deployments", json=spec)
    except (BadForm, ApiRefused) as exc:  # the API's verdict on the values, on the form
        values = {k: v[-1] for k, v in fields.items()}
        return await _list_page(
            request, who, exc.status, error=f"{exc.status}: {exc.message}", values=values
        )
    return redirect(f"/ui/deployments/{quote(doc['name'], safe='')}")


async def _one_page(
    request: Request, who: Operator, name: str, status: int = 200, error: str = ""
) -> Response:
    doc = await who.api.get(_path(name))
    mv = await who.api.get("/api/v1/models")
    versions: list[dict[str, Any]] = next(
        (m["versions"] for m in mv if m["name"] == doc["model"]), []
    )
    return render(request, "deployment.html", who, status, d=doc, versions=versions, error=error)


@router.get("/deployments/{name}")
async def deployment(request: Request, name: str, who: Operator = OPERATOR) -> Response:
    return await _one_page(request, who, name)


@router.post("/deployments/{name}/version")
async def change_version(request: Request, name: str, who: Operator = OPERATOR) -> Response:
    fields = await form(request, who)
    try:
        version = one(fields, "version")
        if not version:
            raise BadForm(400, "version: it is needed")
        await who.api.call("PATCH", _path(name), json={"version": version})
    except (BadForm, ApiRefused) as exc:  # a version not validated, a rollout still active
        try:
            return await _one_page(request, who, name, exc.status, f"{exc.status}: {exc.message}")
        except ApiRefused:  # no page to show it on (no such deployment): the refusal alone
            raise exc from None
    return redirect(f"/ui/deployments/{quote(name, safe='')}")


@router.post("/deployments/{name}/pause")
async def pause(request: Request, name: str, who: Operator = OPERATOR) -> Response:
    return await _hold(request, name, who, "pause")


@router.post("/deployments/{name}/resume")
async def resume(request: Request, name: str, who: Operator = OPERATOR) -> Response:
    return await _hold(request, name, who, "resume")


async def _hold(request: Request, name: str, who: Operator, action: str) -> Response:
    """The API's route says what else follows (its running rollout pauses or goes on)."""
    await form(request, who)
    await who.api.call("POST", f"{_path(name)}/{action}")
    return redirect(f"/ui/deployments/{quote(name, safe='')}")


@router.get("/deployments/{name}/confirm/delete")
async def confirm_delete(request: Request, name: str, who: Operator = OPERATOR) -> Response:
    doc = await who.api.get(_path(name))
    here = f"/ui/deployments/{quote(name, safe='')}"
    return confirmation(
        request,
        who,
        title=f"Delete deployment {doc['name']}?",
        meaning=f"It stops deploying {doc['model']} v{doc['version']}; its "
        f"{doc['status']['devices']} devices keep what they run.",
        action=f"{here}/delete",
        back=here,
        button="Delete the deployment",
    )


@router.post("/deployments/{name}/delete")
async def delete(request: Request, name: str, who: Operator = OPERATOR) -> Response:
    await form(request, who)
    await who.api.call("DELETE", _path(name))
    return redirect("/ui/deployments")
