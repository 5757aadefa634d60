"""A new model version from the browser, as ``edgefleet models push DIR`` makes one: the
files of one variant (a model file, a pipeline's files, an OpenVINO IR's .xml and .bin, a
generative model's folder) with golden.npz, validation.npz and reference.npz beside them.

The multipart form is spooled by Starlette (to disk past 1 MB a file), written to a scratch
folder under the files' own names, classified by the CLI's own rules (what makes a variant
and in which order its files go) and uploaded to the API with the operator's token, each file
streamed. A refusal (of the form or of the API) comes back on the form; a version the API
created before a file was refused is left unfinished, to be discarded from its page.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException
from starlette.responses import Response

from control_plane.console.api import ApiRefused
from control_plane.console.sessions import csrf_ok
from control_plane.console.web import OPERATOR, BadForm, Operator, redirect, render, same_site

router = APIRouter(prefix="/ui", include_in_schema=False)
MAX_FILES = 64
SAMPLES = (("golden.npz", "golden"), ("validation.npz", "validation-data"))
FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
CHUNK_BYTES = 1 << 20


@router.get("/models/new")
async def new_version(request: Request, who: Operator = OPERATOR) -> Response:
    return render(request, "model_new.html", who, values={})


@router.post("/models/new")
async def upload(request: Request, who: Operator = OPERATOR) -> Response:
    same_site(request)
    values: dict[str, str] = {}
    try:
        async with request.form(max_files=MAX_FILES, max_fields=16) as data:
            if not csrf_ok(who.session, _text(data.get("csrf"))):
                raise BadForm(403, "the form's CSRF token is missing or wrong: reload the page")
            values = {k: _text(data.get(k)) for k in ("name", "version", "profiles")}
            files = [f for f in data.getlist("files") if isinstance(f, UploadFile) and f.filename]
            where = await _push(who, values, files)
    except MultiPartException as exc:
        return _again(request, who, 400, f"400: the form cannot be read: {exc.message}", values)
    except (BadForm, ApiRefused) as exc:  # the form's fault or the API's verdict, on the form
        return _again(request, who, exc.status, f"{exc.status}: {exc.message}", values)
    return redirect(where)


def _again(
    request: Request, who: Operator, status: int, error: str, values: dict[str, str]
) -> Response:
    return render(request, "model_new.html", who, status, error=error, values=values)


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""


async def _push(who: Operator, values: dict[str, str], files: list[UploadFile]) -> str:
    """Create the version and upload its files; the page of the version made."""
    name, number = values["name"], values["version"]
    if not number.isdigit():
        raise BadForm(400, f"version: a whole number from 1, not {number!r}")
    if not files:
        raise BadForm(400, "files: choose the model's files")
    with tempfile.TemporaryDirectory(prefix="edgefleet-upload-") as scratch:
        folder = Path(scratch)
        for f in files:
            base = Path(f.filename or "").name
            if not FILE_NAME.match(base) or (folder / base).exists():
                raise BadForm(400, f"files: {f.filename!r} is not a file name a variant takes")
            with (folder / base).open("wb") as out:
                shutil.copyfileobj(f.file, out, CHUNK_BYTES)
        profiles = tuple(p.strip() for p in values["profiles"].split(",") if p.strip())
        await upload_version(who, name, int(number), [(folder, profiles)], source=None)
    return version_page(name, int(number))


def version_page(name: str, number: int) -> str:
    return f"/ui/models/{quote(name, safe='')}/versions/{number}"


async def upload_version(
    who: Operator,
    name: str,
    number: int,
    variants: list[tuple[Path, tuple[str, ...]]],
    source: dict[str, Any] | None,
) -> None:
    """Create NAME vNUMBER from variant folders (each classified first) and upload their
    files, streamed, and the version's samples from the first folder that has each."""
    classified = [(_variant(folder), profiles) for folder, profiles in variants]
    path = f"/api/v1/models/{quote(name, safe='')}/versions"
    spec: dict[str, Any] = {
        "version": number,
        "variants": [{"format": fmt, "profiles": list(p)} for (fmt, _), p in classified],
    }
    if source is not None:
        spec["source"] = source
    await who.api.call("POST", path, json=spec)
    for index, ((_, model_files), _) in enumerate(classified):
        for model_file in model_files:
            url = f"{path}/{number}/variants/{index}/files/{quote(model_file.name, safe='')}"
            await who.api.call("PUT", url, content=_chunks(model_file))
    for sample, route in (*SAMPLES, ("reference.npz", "reference")):
        found = next((f / sample for f, _ in variants if (f / sample).is_file()), None)
        if found is not None:
            await who.api.call("PUT", f"{path}/{number}/{route}", content=_chunks(found))


async def _chunks(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            yield chunk


def _variant(folder: Path) -> tuple[str, list[Path]]:
    """The folder's format and its files in upload order, by the rules of ``models push``."""
    from control_plane.registry.variant_dirs import variant_files
    from runtimes.errors import ModelFileError

    try:
        return variant_files(folder)
    except (ModelFileError, OSError) as exc:
        raise BadForm(400, f"files: {exc}") from None
