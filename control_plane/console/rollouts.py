"""Rollout pages: the list, one rollout's live progress, the form that creates one (with the
devices it would reach) and the confirmed actions. Each change is the API's own route."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from control_plane.console import views
from control_plane.console.api import ApiRefused
from control_plane.console.forms import pairs, rollout_spec
from control_plane.console.web import (
    OPERATOR,
    BadForm,
    Operator,
    form,
    redirect,
    refresh_s,
    render,
)
from control_plane.db.states import ACTIVE, RolloutState
from control_plane.status_view import gate_words, phase_words, shadow_words

router = APIRouter(prefix="/ui", include_in_schema=False)
PREVIEW_DEVICES = 100
"""Devices a rollout's preview lists (it counts them all)."""
PROFILES = Query(default=[], description="hardware profiles; none: every profile")

ACTIONS = {
    "pause": ("Pause", "New devices get no update until it is resumed."),
    "resume": ("Resume", "The rollout goes on from its current wave."),
    "cancel": ("Cancel", "The rollout stops; devices keep the version they have now."),
    "abort": ("Abort and roll back", "The rollout stops and every updated device goes back."),
}
WHEN = {
    RolloutState.RUNNING: ("pause", "cancel", "abort"),
    RolloutState.PAUSED: ("resume", "cancel", "abort"),
}


def actions_for(doc: dict[str, Any]) -> tuple[str, ...]:
    return WHEN.get(RolloutState(doc["state"]), ())


def progress(doc: dict[str, Any]) -> dict[str, Any]:
    """What the progress fragment shows: each wave with its shadow phase (in the CLI's words,
    ``rollouts status``), its gate verdict and its devices."""
    waves = []
    shadow = doc.get("shadow") or {}
    for w in doc["waves"]:
        verdict = gate_words({**doc, "current_wave": w["wave"]})
        phase = shadow.get("waves", {}).get(str(w["wave"]))
        devices = [
            {"id": d["device_id"], "state": d["state"], "words": phase_words(d)}
            for d in doc["devices"]
            if d["wave"] == w["wave"]
        ]
        words = shadow_words(phase, shadow["spec"]) if phase else None
        waves.append(w | {"verdict": verdict, "shadow": words, "device_rows": devices})
    live = doc["state"] in ACTIVE
    return {
        "doc": doc,
        "waves": waves,
        "live": live,
        "actions": actions_for(doc),
        "labels": ACTIONS,
    }


@router.get("/rollouts")
async def rollouts(
    request: Request, before: int | None = Query(default=None, ge=1), who: Operator = OPERATOR
) -> Response:
    found = await who.api.get("/api/v1/rollouts", limit=50, before=before)
    older = found[-1]["id"] if len(found) == 50 else None
    return render(request, "rollouts.html", who, rollouts=found, older=older)


@router.get("/rollouts/new")
async def new_rollout(request: Request, who: Operator = OPERATOR) -> Response:
    return render(request, "rollout_new.html", who, **await _form_choices(who), values={})


@router.get("/rollouts/preview")
async def preview(
    request: Request,
    selector: str = "",
    profiles: list[str] = PROFILES,
    who: Operator = OPERATOR,
) -> Response:
    """The devices a rollout of this selector and these profiles would reach (an htmx part)."""
    try:
        labels = pairs(selector)
    except BadForm as exc:
        return render(request, "_preview.html", who, error=exc.message, count=0, shown=[])
    label = [f"{k}={v}" for k, v in labels.items()]
    # the count from the summary, the first 100 from pages: never the whole fleet
    summary = await who.api.get("/api/v1/devices/summary", label=label)
    count = sum(
        r["devices"]
        for r in summary["presence"]
        if not profiles or r["hardware_profile"] in profiles
    )
    shown: list[dict[str, object]] = []
    after: str | None = ""
    while len(shown) < PREVIEW_DEVICES:
        page, after = await who.api.page(
            "/api/v1/devices",
            label=label,
            profile=profiles[0] if len(profiles) == 1 else "",
            limit=PREVIEW_DEVICES if len(profiles) <= 1 else 1000,
            after=after,
        )
        shown += [d for d in page if not profiles or d["hardware_profile"] in profiles]
        if not after:
            break
    return render(request, "_preview.html", who, count=count, shown=shown[:PREVIEW_DEVICES])


@router.get("/rollouts/noise")
async def noise(
    request: Request,
    model: str = "",
    selector: str = "",
    bake_time_s: str = "",
    max_p99_ratio: str = "",
    who: Operator = OPERATOR,
) -> Response:
    """A warning when the p99 gate is likely to trip on the fleet's own p99 swings (an htmx
    part; empty when it is not, or when the form cannot say yet)."""
    try:
        labels = pairs(selector)
        bake, limit = float(bake_time_s), float(max_p99_ratio)
    except (BadForm, ValueError):
        return render(request, "_noise.html", who, noise=None, limit=None)
    if not model or bake <= 0 or limit <= 0:
        return render(request, "_noise.html", who, noise=None, limit=None)
    doc = await who.api.get(
        f"/api/v1/models/{quote(model, safe='')}/p99-noise",
        label=[f"{k}={v}" for k, v in labels.items()],
        bake_time_s=bake,
    )
    ratio = doc["worst_ratio"]
    # warned from 80 % of the limit: one more swing like the worst one trips it
    tripping = ratio is not None and doc["slices"] > 1 and ratio >= 0.8 * limit
    return render(request, "_noise.html", who, noise=doc if tripping else None, limit=limit)


@router.post("/rollouts")
async def create(request: Request, who: Operator = OPERATOR) -> Response:
    fields = await form(request, who)
    values = {k: v[-1] for k, v in fields.items()}
    try:
        spec = rollout_spec(fields)
        doc = await who.api.call("POST", "/api/v1/rollouts", json=spec)
    except BadForm as exc:
        status, error = exc.status, exc.message
    except ApiRefused as exc:  # the API's own verdict on the values, shown on the form
        status, error = exc.status, f"{exc.status}: {exc.message}"
    else:
        return redirect(f"/ui/rollouts/{doc['id']}")
    choices = await _form_choices(who)
    return render(request, "rollout_new.html", who, status, error=error, values=values, **choices)


@router.get("/rollouts/{rollout_id}")
async def rollout(request: Request, rollout_id: int, who: Operator = OPERATOR) -> Response:
    doc = await who.api.get(f"/api/v1/rollouts/{rollout_id}")
    return render(request, "rollout.html", who, refresh_s=refresh_s(request), **progress(doc))


@router.get("/rollouts/{rollout_id}/progress")
async def rollout_progress(request: Request, rollout_id: int, who: Operator = OPERATOR) -> Response:
    doc = await who.api.get(f"/api/v1/rollouts/{rollout_id}")
    return render(request, "_progress.html", who, refresh_s=refresh_s(request), **progress(doc))


@router.get("/rollouts/{rollout_id}/confirm/{action}")
async def confirm(
    request: Request, rollout_id: int, action: str, who: Operator = OPERATOR
) -> Response:
    if action not in ACTIONS:
        raise BadForm(404, f"no action {action!r}: {', '.join(ACTIONS)}")
    doc = await who.api.get(f"/api/v1/rollouts/{rollout_id}")
    label, meaning = ACTIONS[action]
    return render(
        request, "confirm.html", who, doc=doc, action=action, label=label, meaning=meaning
    )


@router.post("/rollouts/{rollout_id}/{action}")
async def act(request: Request, rollout_id: int, action: str, who: Operator = OPERATOR) -> Response:
    await form(request, who)
    if action not in ACTIONS:
        raise BadForm(404, f"no action {action!r}: {', '.join(ACTIONS)}")
    await who.api.call("POST", f"/api/v1/rollouts/{rollout_id}/{action}")
    return redirect(f"/ui/rollouts/{rollout_id}")


async def _form_choices(who: Operator) -> dict[str, Any]:
    models = await who.api.get("/api/v1/models")
    summary = await who.api.get("/api/v1/devices/summary")
    return {
        "models": models,
        "profiles": sorted({r["hardware_profile"] for r in summary["presence"]} - {None}),
        "fleet": views.fleet_counts(summary),
    }
