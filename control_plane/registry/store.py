"""The model registry: models, immutable versions, artifacts stored by digest, stages.

Uploads stream to disk while hashed and counted, and are renamed into place only when whole;
a version's files are served to devices at ``/artifacts/sha256/<digest>``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from common.model_config import ModelConfig
from common.pipeline_config import PIPELINE_FILES
from common.protocol.messages import HealthCriteria
from control_plane.db.models import Artifact, Model, ModelVersion
from control_plane.db.session import required_utc
from control_plane.errors import Conflict, Invalid, NotFound, TooLarge
from runtimes.errors import ModelFileError, RuntimeFailure, validation_message
from runtimes.formats import GENAI_CONFIG, GENAI_FORMAT, ModelFormat, find_model_file

STAGES = ("candidate", "production", "retired")
_FILE_SUFFIX = {
    "onnx": (".onnx",),
    "tflite": (".tflite",),
    "openvino_ir": (".xml", ".bin"),
    GENAI_FORMAT: (GENAI_CONFIG, ".onnx", "tokenizer.json"),
}
"""What a variant of each format must hold before it is complete (name endings)."""
_GENAI_FILES = (".json", ".onnx", ".onnx.data", ".onnx_data", ".data", ".jinja", ".txt")
"""What a generative folder's files may be called: config, decoder and its weights, tokenizer
files, chat templates."""


class ArtifactStore:
    def __init__(self, root: Path, max_bytes: int) -> None:
        # absolute: the links materialise makes must not be read relative to where they lie
        self.root = root.absolute()
        self.max_bytes = max_bytes
        (root / ".incoming").mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256

    async def put(self, chunks: AsyncIterator[bytes]) -> tuple[str, int]:
        """Store a stream; return (sha256, size). Refused past ``max_bytes``."""
        digest, size = hashlib.sha256(), 0
        fd, scratch = tempfile.mkstemp(dir=self.root / ".incoming")
        try:
            with os.fdopen(fd, "wb") as fh:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise TooLarge(f"upload is over the limit of {self.max_bytes} bytes")
                    digest.update(chunk)
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
            sha = digest.hexdigest()
            target = self.path(sha)
            target.parent.mkdir(exist_ok=True)
            os.replace(scratch, target)  # same content, same name: idempotent
            return sha, size
        except BaseException:
            Path(scratch).unlink(missing_ok=True)
            raise

    def put_file(self, source: Path) -> tuple[str, int]:
        """Store a file made here (blocking); return (sha256, size)."""
        digest = hashlib.sha256()
        with source.open("rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
        sha, size = digest.hexdigest(), source.stat().st_size
        if size > self.max_bytes:
            raise TooLarge(f"{source.name} is over the limit of {self.max_bytes} bytes")
        target = self.path(sha)
        target.parent.mkdir(exist_ok=True)
        fd, scratch = tempfile.mkstemp(dir=self.root / ".incoming")
        os.close(fd)
        shutil.copyfile(source, scratch)
        os.replace(scratch, target)
        return sha, size

    def materialise(self, files: list[dict[str, Any]], directory: Path) -> Path:
        """Link a variant's files under their own names into ``directory`` (IR needs its .bin
        beside its .xml); return the directory."""
        for f in files:
            os.symlink(self.path(f["sha256"]), directory / f["name"])
        return directory


async def get_model(session: AsyncSession, name: str) -> Model:
    model = (await session.execute(select(Model).where(Model.name == name))).scalar_one_or_none()
    if model is None:
        raise NotFound(f"no model {name!r}")
    return model


async def get_version(session: AsyncSession, name: str, version: int) -> ModelVersion:
    row = await session.execute(
        select(ModelVersion)
        .join(Model)
        .where(Model.name == name, ModelVersion.version == version)
        .options(selectinload(ModelVersion.model))
    )
    mv = row.scalar_one_or_none()
    if mv is None:
        raise NotFound(f"model {name!r} has no version {version}")
    return mv


async def ensure_model(session: AsyncSession, name: str, description: str = "") -> Model:
    model = (await session.execute(select(Model).where(Model.name == name))).scalar_one_or_none()
    if model is None:
        model = Model(
            name=name, description=description, next_sequence=1, created_at=datetime.now(UTC)
        )
        session.add(model)
        await session.flush()
    return model


async def create_version(
    session: AsyncSession,
    name: str,
    version: int,
    *,
    variants: list[dict[str, Any]],
    config: dict[str, Any],
    health: dict[str, Any],
    user: str,
    source: dict[str, Any] | None = None,
) -> ModelVersion:
    try:
        ModelConfig.model_validate(config)
    except ValidationError as exc:
        raise Invalid(f"config: {validation_message(exc)}") from None
    try:
        HealthCriteria.model_validate(health)
    except ValidationError as exc:
        raise Invalid(f"health: {validation_message(exc)}") from None
    clean = []
    for i, v in enumerate(variants):
        fmt = v.get("format")
        if fmt not in _FILE_SUFFIX:
            raise Invalid(f"variants[{i}].format: {fmt!r} is not one of {sorted(_FILE_SUFFIX)}")
        profiles = v.get("profiles", [])
        if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
            raise Invalid(f"variants[{i}].profiles: must be a list of profile names")
        clean.append({"format": fmt, "profiles": profiles, "files": [], "signature": None})
    if not clean:
        raise Invalid("variants: a version needs at least one variant")
    model = await ensure_model(session, name)
    existing = (
        await session.execute(
            select(ModelVersion).where(
                ModelVersion.model_id == model.id, ModelVersion.version == version
            )
        )
    ).scalar_one_or_none()
    if existing is not None:
        if complete(existing):
            raise Conflict(f"model {name!r} already has version {version}; versions are immutable")
        started = required_utc(existing.created_at)
        if datetime.now(UTC) - started < STALE_PUSH:
            raise Conflict(
                f"version {version} of {name!r} is being pushed (started {started.isoformat()} "
                f"by {existing.uploaded_by}); if that push died, discard it: DELETE "
                f"/api/v1/models/{name}/versions/{version} (edgefleet models discard)"
            )
        # a push that never finished long ago (its client died): the number was never used
        await session.delete(existing)
        await session.flush()
    mv = ModelVersion(
        model_id=model.id,
        version=version,
        config=config,
        health=health,
        variants=clean,
        uploaded_by=user,
        created_at=datetime.now(UTC),
        stage="candidate",
        source=source,
    )
    session.add(mv)
    await session.flush()
    return mv


def check_file_name(fmt: str, filename: str) -> None:
    if "/" in filename or filename.startswith(".") or not filename:
        raise Invalid(f"file name {filename!r} is not allowed")
    if fmt == GENAI_FORMAT:
        if not filename.endswith(_GENAI_FILES):
            raise Invalid(
                f"a {fmt} variant holds a generative folder's files "
                f"({', '.join(_GENAI_FILES)}), not {filename!r}"
            )
        return
    if not filename.endswith(_FILE_SUFFIX[fmt]) and not PIPELINE_FILES.match(filename):
        raise Invalid(
            f"a {fmt} variant holds {' and '.join(_FILE_SUFFIX[fmt])} files and a pipeline's "
            f"(pipeline.toml, pipeline_golden.npz, *.txt, *.py), not {filename!r}"
        )


STALE_PUSH = timedelta(minutes=30)
"""An unfinished push this old is replaced by the next push of its number."""


def complete(mv: ModelVersion) -> bool:
    """Whether every variant of ``mv`` has its files, checked (their signature read). Until then
    the version is a push in progress: it can be neither validated nor rolled out, a failed
    check of its files discards it, and so can its pusher (or, :data:`STALE_PUSH` later, a
    push of the same number)."""
    return all(v.get("signature") for v in mv.variants)


def variant_complete(variant: dict[str, Any]) -> bool:
    names = [f["name"] for f in variant["files"]]
    return all(any(n.endswith(sfx) for n in names) for sfx in _FILE_SUFFIX[variant["format"]])


async def record_artifact(session: AsyncSession, sha: str, size: int) -> None:
    if await session.get(Artifact, sha) is None:
        session.add(Artifact(sha256=sha, size=size, created_at=datetime.now(UTC)))


def read_signature(store: ArtifactStore, variant: dict[str, Any]) -> dict[str, Any]:
    """Load the variant with the project's runtimes (blocking) and return its signature."""
    from runtimes.backends import BACKENDS, open_model
    from runtimes.base import Placement

    if variant["format"] == GENAI_FORMAT:
        return _generative_signature(store, variant)
    fmt = ModelFormat(variant["format"])
    runtime = next(
        name for name, cls in BACKENDS.items() if fmt in cls.formats and _installed(name)
    )
    with tempfile.TemporaryDirectory() as scratch:
        model_file, _ = find_model_file(store.materialise(variant["files"], Path(scratch)))
        providers = ("CPUExecutionProvider",) if runtime == "onnxruntime" else ()
        try:
            loaded = open_model(model_file, Placement(runtime=runtime, providers=providers))
        except RuntimeFailure as exc:
            raise Invalid(f"the {fmt.value} file does not load: {exc}") from exc
        try:
            return loaded.signature.model_dump(mode="json")
        finally:
            loaded.close()


def _generative_signature(store: ArtifactStore, variant: dict[str, Any]) -> dict[str, Any]:
    """A generative folder's signature: what its config says of the model. A config that does
    not read is no refusal here: validation names the reason (``models validate``), as it does
    for every other fault of the folder."""
    from runtimes.generative_check import GenaiFolder

    with tempfile.TemporaryDirectory() as scratch:
        try:
            folder = GenaiFolder.read(store.materialise(variant["files"], Path(scratch)))
        except ModelFileError as exc:
            return {"generative": {"problem": str(exc)}}
    return {
        "generative": {
            "decoder": folder.decoder_file.name,
            "vocab_size": folder.vocab,
            "context_length": folder.context,
            "layers": folder.layers,
        }
    }


def _installed(runtime: str) -> bool:
    from runtimes.inventory import probe_runtimes

    return probe_runtimes().get(runtime).installed


async def add_file(
    session: AsyncSession,
    store: ArtifactStore,
    mv: ModelVersion,
    index: int,
    filename: str,
    sha: str,
    size: int,
) -> dict[str, Any]:
    if not 0 <= index < len(mv.variants):
        raise NotFound(f"version {mv.version} has no variant {index}")
    variants = [dict(v) for v in mv.variants]
    variant = variants[index]
    check_file_name(variant["format"], filename)
    variant["files"] = [f for f in variant["files"] if f["name"] != filename] + [
        {"name": filename, "sha256": sha, "size": size}
    ]
    await record_artifact(session, sha, size)
    if variant_complete(variant):
        variant["signature"] = await asyncio.to_thread(read_signature, store, variant)
    mv.variants = variants
    mv.validation = None  # the files changed: validate again
    return variant
