"""Registry routes: models, versions, uploads, validation, stages; artifacts by digest."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload
from starlette.responses import Response, StreamingResponse

from control_plane.api import audit
from control_plane.api.body import json_body, json_request
from control_plane.api.deps import (
    INDEX,
    INT32_MAX,
    OPERATOR,
    SESSION,
    VERSION,
    VIEWER,
    json_response,
    services,
)
from control_plane.db.models import NAME_LENGTH, Artifact, Model, ModelVersion
from control_plane.db.session import stored_utc
from control_plane.errors import Conflict, Invalid, NotFound
from control_plane.quality.optimise import VariantKind
from control_plane.quality.reference import REFERENCE_FILE, load_reference
from control_plane.quality.speeds import load_speeds, measured_on
from control_plane.quality.variants import optimise
from control_plane.registry.store import (
    add_file,
    complete,
    create_version,
    get_model,
    get_version,
    record_artifact,
)
from control_plane.registry.validation import validate
from control_plane.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["Model registry"])
artifacts = APIRouter(tags=["Artifacts"])


class VariantSpec(BaseModel):
    format: Literal["onnx", "openvino_ir", "tflite", "genai"]
    profiles: list[str] = Field(default_factory=list)


class MlflowSource(BaseModel):
    """The MLflow model a version's files were taken from (``models push models:/...``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["mlflow"]
    registered_model: str = Field(min_length=1, max_length=256)
    version: int = Field(ge=1, le=INT32_MAX)
    """The MLflow model version (MLflow's own number, not ours)."""
    run_id: str | None = Field(default=None, max_length=64)
    """The run that logged the model, when MLflow knows it."""
    alias: str | None = Field(default=None, max_length=256)
    """The alias (``@champion``) the version was resolved through; None for ``NAME/VERSION``."""
    tracking_uri: str = Field(default="", max_length=2000)
    """The registry it was resolved against, without any credentials in it."""


class VersionCreate(BaseModel):
    version: int = Field(ge=1, le=INT32_MAX)
    variants: list[VariantSpec] = Field(min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)
    health: dict[str, Any] = Field(default_factory=dict)
    description: str = ""
    source: MlflowSource | None = None
    """Where the files come from, when not from directories: shown with the version."""


class StageChange(BaseModel):
    stage: Literal["candidate", "production", "retired", "archived"]
    """``archived`` hides a version (one that failed validation, say) from default listings."""


class OptimiseRequest(BaseModel):
    max_accuracy_drop: float = Field(default=0.01, ge=0, le=1)
    """A variant is refused when its accuracy on the reference set is more than this below
    the FP32 model's (a fraction: 0.01 is one point); without labels, when its top-1
    agreement with the FP32 answers is below 1 - this."""
    kinds: list[VariantKind] = Field(default_factory=lambda: list(VariantKind), min_length=1)


NEW_VERSION = json_body(VersionCreate, OPERATOR)
OPTIMISE = json_body(OptimiseRequest, OPERATOR)
NEW_STAGE = json_body(StageChange, OPERATOR)


def version_doc(mv: ModelVersion) -> dict[str, Any]:
    return {
        "model": mv.model.name,
        "version": mv.version,
        "stage": mv.stage,
        "complete": complete(mv),
        "config": mv.config,
        "health": mv.health,
        "variants": mv.variants,
        "golden": mv.golden,
        "validation_data": mv.validation_data,
        "validation": mv.validation,
        "reference": mv.reference,
        "optimisation": mv.optimisation,
        "source": mv.source,
        "uploaded_by": mv.uploaded_by,
        "created_at": stored_utc(mv.created_at).isoformat(),
    }


def variant_summary(variant: dict[str, Any]) -> dict[str, Any]:
    """A variant as listings show it: format, profiles, and for an optimised one its kind and
    the numbers it was judged by."""
    done = variant.get("optimisation") or {}
    return {
        "format": variant["format"],
        "profiles": variant["profiles"],
        "kind": done.get("kind", "fp32"),
        "accuracy_delta": done.get("accuracy_delta"),
        "agreement": done.get("agreement"),
        "max_abs_diff": done.get("max_abs_diff"),
    }


@router.get("/models", summary="Every model with its versions and stages")
async def list_models(
    s: AsyncSession = SESSION, _: Principal = VIEWER, archived: bool = False
) -> Response:
    """``archived``: list archived versions too (hidden by default)."""
    models = (
        await s.execute(select(Model).options(selectinload(Model.versions)).order_by(Model.name))
    ).scalars()
    speeds = await load_speeds(s)  # what devices measured for the variant they serve
    return json_response(
        [
            {
                "name": m.name,
                "description": m.description,
                "versions": [
                    {
                        "version": v.version,
                        "stage": v.stage,
                        "validated": None if v.validation is None else v.validation["passed"],
                        "source": v.source,
                        "variants": [
                            variant_summary(variant)
                            | {
                                "measured": measured_on(
                                    v.variants, i, speeds.get((m.name, v.version), [])
                                )
                            }
                            for i, variant in enumerate(v.variants)
                        ],
                    }
                    for v in m.versions
                    if archived or v.stage != "archived"
                ],
            }
            for m in models
        ]
    )


@router.get(
    "/models/{name}/versions/{version}", summary="One version: files, signature, validation"
)
async def show_version(
    name: str, version: int = VERSION, s: AsyncSession = SESSION, _: Principal = VIEWER
) -> Response:
    return json_response(version_doc(await get_version(s, name, version)))


@router.post(
    "/models/{name}/versions",
    status_code=201,
    summary="Create a version (then upload its files)",
    openapi_extra=json_request(VersionCreate),
)
async def new_version(
    name: str,
    body: VersionCreate = NEW_VERSION,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise Invalid("name: use letters, digits, '.', '_' or '-'")
    if len(name) > NAME_LENGTH:  # the column's width: PostgreSQL refuses longer (a 500)
        raise Invalid(f"name: at most {NAME_LENGTH} characters")
    mv = await create_version(
        s,
        name,
        body.version,
        variants=[v.model_dump() for v in body.variants],
        config=body.config,
        health=body.health,
        user=who.name,
        source=body.source.model_dump() if body.source else None,
    )
    if body.description:
        (await get_model(s, name)).description = body.description
    # where the files come from, in the audit trail too: who pushed which MLflow run
    origin = {"source": body.source.model_dump()} if body.source else {}
    audit.record(s, who.name, "version.create", f"{name}:{body.version}", **origin)
    await s.commit()
    await s.refresh(mv, ["model"])
    return json_response(version_doc(mv), 201)


async def _stream(request: Request):  # type: ignore[no-untyped-def]
    async for chunk in request.stream():
        yield chunk


@router.put(
    "/models/{name}/versions/{version}/variants/{index}/files/{filename}",
    summary="Upload one file of a variant (streamed; signature read once the variant is whole)",
)
async def upload_file(
    name: str,
    filename: str,
    request: Request,
    version: int = VERSION,
    index: int = INDEX,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    mv = await get_version(s, name, version)
    if complete(mv):
        raise Conflict(f"{name} v{version} is complete and immutable; push a new version")
    push_id, push_started = mv.id, mv.created_at
    sha, size = await services(request).store.put(_stream(request))
    try:
        variant = await add_file(s, services(request).store, mv, index, filename, sha, size)
    except Invalid as exc:
        if complete(mv):
            raise
        # A push is atomic: a version whose files fail their checks is not kept, and its
        # number is free for the push that fixes them.
        await s.rollback()
        fresh = await s.get(ModelVersion, push_id)
        # only this push, if it is still there and unfinished (not one that replaced it)
        if fresh is not None and fresh.created_at == push_started and not complete(fresh):
            await s.delete(fresh)
            audit.record(s, who.name, "version.discard", f"{name}:{version}", reason=str(exc))
            await s.commit()
        raise Invalid(
            f"{exc}; version {version} was not kept: fix its files and push it again"
        ) from None
    audit.record(
        s, who.name, "version.upload", f"{name}:{version}", file=filename, sha256=sha, size=size
    )
    await s.commit()
    return json_response({"sha256": sha, "size": size, "variant": variant})


@router.put(
    "/models/{name}/versions/{version}/{kind}",
    summary="Upload golden.npz, the validation set or the reference set (npz)",
)
async def upload_sample(
    name: str,
    kind: Literal["golden", "validation-data", "reference"],
    request: Request,
    version: int = VERSION,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    mv = await get_version(s, name, version)
    sha, size = await services(request).store.put(_stream(request))
    await record_artifact(s, sha, size)
    names = {"golden": "golden.npz", "validation-data": "validation.npz"}
    ref = {"name": names.get(kind, REFERENCE_FILE), "sha256": sha, "size": size}
    if kind == "golden":
        mv.golden = ref
    elif kind == "reference":
        # checked now, so a bad file is refused at push rather than at the first optimise
        await asyncio.to_thread(load_reference, services(request).store.path(sha))
        mv.reference = ref
        mv.optimisation = None
    else:
        mv.validation_data = ref
    mv.validation = None
    audit.record(s, who.name, f"version.{kind}", f"{name}:{version}", sha256=sha)
    await s.commit()
    return json_response(ref)


@router.post(
    "/models/{name}/versions/{version}/validate", summary="Validate; the result is stored and shown"
)
async def validate_version(
    name: str,
    request: Request,
    version: int = VERSION,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    svc = services(request)
    mv = await get_version(s, name, version)
    production = (
        (
            await s.execute(
                select(ModelVersion).where(
                    ModelVersion.model_id == mv.model_id,
                    ModelVersion.stage == "production",
                    ModelVersion.id != mv.id,
                )
            )
        )
        .scalars()
        .first()
    )
    prod_accuracy = (production.validation or {}).get("accuracy") if production else None
    cfg = svc.settings
    report = await asyncio.to_thread(
        validate,
        svc.store,
        mv.variants,
        mv.golden,
        mv.validation_data,
        prod_accuracy,
        rtol=cfg.validation_rtol,
        atol=cfg.validation_atol,
        margin=cfg.accuracy_margin,
        reference=mv.reference,
    )
    if made := report.get("model_reference"):  # a pipeline's drift reference, kept
        await record_artifact(s, made["sha256"], made["size"])
    mv.validation = report
    audit.record(s, who.name, "version.validate", f"{name}:{version}", passed=report["passed"])
    await s.commit()
    return json_response(report)


@router.post(
    "/models/{name}/versions/{version}/optimise",
    summary="Build INT8/FP16 variants per hardware profile, judged on the reference set",
    openapi_extra=json_request(OptimiseRequest),
)
async def optimise_version(
    name: str,
    request: Request,
    version: int = VERSION,
    body: OptimiseRequest = OPTIMISE,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    mv = await get_version(s, name, version)
    if not complete(mv):
        raise Conflict(f"{name} v{version} is still being pushed: upload its files first")
    if mv.stage != "candidate":
        raise Conflict(f"{name} v{version} is {mv.stage}: only a candidate's variants may change")
    if mv.reference is None:
        raise Invalid(f"{name} v{version} has no reference set: push it with --reference FILE")
    variants, report = await asyncio.to_thread(
        optimise,
        services(request).store,
        mv.variants,
        mv.reference,
        mv.golden,
        max_accuracy_drop=body.max_accuracy_drop,
        kinds=tuple(body.kinds),
    )
    # what was built is served to devices by digest
    for sha, size in {(f["sha256"], f["size"]) for v in variants for f in v["files"]}:
        await record_artifact(s, sha, size)
    mv.variants = variants
    mv.optimisation = report
    mv.validation = None  # new variants: validate again
    outcomes = {r["kind"]: r["outcome"] for r in report["results"]}
    audit.record(s, who.name, "version.optimise", f"{name}:{version}", **outcomes)
    await s.commit()
    return json_response(report)


@router.delete(
    "/models/{name}/versions/{version}",
    summary="Discard an unfinished push (a complete version is immutable: archive it instead)",
)
async def discard_version(
    name: str, version: int = VERSION, s: AsyncSession = SESSION, who: Principal = OPERATOR
) -> Response:
    mv = await get_version(s, name, version)
    if complete(mv):
        raise Conflict(
            f"{name} v{version} is complete and immutable; set its stage to archived to hide it"
        )
    await s.delete(mv)
    audit.record(s, who.name, "version.discard", f"{name}:{version}", reason="discarded")
    await s.commit()
    return json_response({"model": name, "version": version, "discarded": True})


@router.post(
    "/models/{name}/versions/{version}/stage",
    summary="Set the stage: candidate, production, retired, archived",
    openapi_extra=json_request(StageChange),
)
async def set_stage(
    name: str,
    version: int = VERSION,
    body: StageChange = NEW_STAGE,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    mv = await get_version(s, name, version)
    if body.stage == "archived" and mv.stage == "production":
        raise Conflict(f"{name} v{version} is in production: promote another version first")
    if body.stage == "production":
        if not (mv.validation or {}).get("passed"):
            raise Invalid("stage: only a version that passed validation can be production")
        others = (
            await s.execute(
                select(ModelVersion).where(
                    ModelVersion.model_id == mv.model_id, ModelVersion.stage == "production"
                )
            )
        ).scalars()
        for other in others:
            other.stage = "retired" if other.id != mv.id else other.stage
    mv.stage = body.stage
    audit.record(s, who.name, "version.stage", f"{name}:{version}", stage=body.stage)
    await s.commit()
    return json_response({"model": name, "version": version, "stage": mv.stage})


@artifacts.get(
    "/artifacts/sha256/{digest}", summary="An artifact by digest (Range supported, for resume)"
)
async def get_artifact(digest: str, request: Request, s: AsyncSession = SESSION) -> Response:
    if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        raise Invalid("digest: expected 64 lowercase hex digits")
    record = await s.get(Artifact, digest)
    path = services(request).store.path(digest)
    if record is None or not path.is_file():
        raise NotFound(f"no artifact {digest}")
    size = record.size
    start, end = 0, size - 1
    status = 200
    header = request.headers.get("range")
    if header and header.startswith("bytes="):
        first, _, last = header[6:].partition("-")
        try:
            start = int(first) if first else max(0, size - int(last))
            end = min(int(last), size - 1) if first and last else size - 1
        except ValueError:
            raise Invalid("Range: not understood") from None
        if start >= size or start > end:
            return Response(status_code=416, headers={"Content-Range": f"bytes */{size}"})
        status = 206

    def chunks() -> Iterator[bytes]:
        with path.open("rb") as fh:
            fh.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                block = fh.read(min(1 << 20, remaining))
                if not block:
                    return
                remaining -= len(block)
                yield block

    headers = {
        "Content-Length": str(end - start + 1),
        "Accept-Ranges": "bytes",
        "ETag": f'"{digest}"',
    }
    if status == 206:
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return StreamingResponse(
        chunks(), status_code=status, headers=headers, media_type="application/octet-stream"
    )
