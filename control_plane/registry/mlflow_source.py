"""``models:/`` sources of ``edgefleet models push`` and ``models sync``: a model version in an
MLflow registry, resolved with the ``mlflow`` client and staged as the variant directories a
push uploads.

The client is the ``edgefleet[mlflow]`` extra, imported only when a source names a
``models:/`` URI. The registry is the one ``MLFLOW_TRACKING_URI`` names (MLflow's own
convention; ``--mlflow-tracking-uri`` overrides it; ``MLFLOW_REGISTRY_URI``, when set, is
MLflow's to honour). What is taken from the MLflow model (docs/model-quality.md, "Models from
MLflow"):

- the ONNX flavour's file; its external data (``mlflow.onnx.log_model`` writes weights to a
  side file by default) folded into one self-contained ``model.onnx``, the file devices load;
- from the model's ``extra_files/`` (``log_model(..., extra_files=[...])``): a pipeline's
  files, ``golden.npz`` and ``validation.npz``, as a directory variant would hold them, and an
  OpenVINO IR (``.xml`` with its ``.bin``) as a second variant.

Nothing else goes to devices: not the pyfunc wrapper, not the Conda or virtualenv files (the
Seldon lesson: a device never builds an environment). Every failure is one
:class:`MlflowSourceError` line, raised before anything is sent to the control plane.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from common.cli import one_line

URI_PREFIX = "models:/"
MLFLOW_EXTRA = "pip install 'edgefleet[mlflow]'"
_SAMPLES = frozenset({"golden.npz", "validation.npz"})


class MlflowSourceError(Exception):
    """A ``models:/`` source that cannot be resolved or staged (one line). The CLI shows it
    as its error; the console on the form."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def is_model_uri(item: str) -> bool:
    return item.startswith(URI_PREFIX)


@dataclass(frozen=True)
class ModelRef:
    """A parsed ``models:/NAME/VERSION`` or ``models:/NAME@ALIAS`` (``@profile1,profile2``
    after either reserves the variants for hardware profiles, as after a directory)."""

    registered_model: str
    version: int | None
    alias: str | None
    profiles: tuple[str, ...]
    uri: str

    @classmethod
    def parse(cls, item: str) -> ModelRef:
        body = item.removeprefix(URI_PREFIX)
        if "/" in body:
            name, _, rest = body.rpartition("/")
            number, _, profiles = rest.partition("@")
            if not number.isdigit() or int(number) < 1:
                raise MlflowSourceError(
                    f"{item}: expected models:/NAME/VERSION with a version number, or "
                    "models:/NAME@ALIAS (MLflow's stages are deprecated: use an alias)"
                )
            version, alias = int(number), None
        else:
            name, sep, rest = body.partition("@")
            alias, _, profiles = rest.partition("@")
            version = None
            if not sep or not alias:
                raise MlflowSourceError(
                    f"{item}: expected models:/NAME/VERSION or models:/NAME@ALIAS"
                )
        if not name:
            raise MlflowSourceError(f"{item}: no registered model name")
        uri = URI_PREFIX + name + (f"/{version}" if alias is None else f"@{alias}")
        return cls(name, version, alias, tuple(p for p in profiles.split(",") if p), uri)


@dataclass(frozen=True)
class Staged:
    """A resolved source: its provenance (the API's ``MlflowSource``) and its variants."""

    source: dict[str, Any]
    variants: list[tuple[Path, tuple[str, ...]]]


class MlflowRegistry:
    """One MLflow registry, through the ``mlflow`` client."""

    def __init__(self, tracking_uri: str | None) -> None:
        if not tracking_uri:
            raise MlflowSourceError(
                "no MLflow registry to resolve models:/ against: set MLFLOW_TRACKING_URI "
                "or pass --mlflow-tracking-uri"
            )
        try:
            import mlflow
            from mlflow import MlflowClient
            from mlflow.exceptions import MlflowException
        except ImportError as exc:
            raise MlflowSourceError(
                f"models:/ sources need the MLflow client ({exc}): {MLFLOW_EXTRA}"
            ) from exc
        # its INFO lines (creating a new store's tables, say) are not this command's output
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        self._mlflow, self._failure = mlflow, MlflowException
        self.tracking_uri = tracking_uri
        self.shown_uri = without_credentials(tracking_uri)
        try:
            self.client = MlflowClient(tracking_uri=tracking_uri)
            mlflow.set_tracking_uri(tracking_uri)  # for get_model_info: one command, one registry
        except MlflowException as exc:  # a scheme MLflow has no store for, say
            message = one_line(exc.message)
            raise MlflowSourceError(f"MLflow at {self.shown_uri}: {message}") from exc

    def _failed(self, ref: ModelRef, exc: Exception) -> MlflowSourceError:
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        return MlflowSourceError(f"{ref.uri}: {one_line(message)} (MLflow at {self.shown_uri})")

    def resolve(self, ref: ModelRef) -> Any:
        """The MLflow ``ModelVersion`` the reference names now (an alias read once)."""
        try:
            if ref.alias is not None:
                return self.client.get_model_version_by_alias(ref.registered_model, ref.alias)
            return self.client.get_model_version(ref.registered_model, str(ref.version))
        except self._failure as exc:
            raise self._failed(ref, exc) from exc

    def stage(self, ref: ModelRef, found: Any, scratch: Path) -> Staged:
        """Download the model version ``found`` (from :meth:`resolve`) and lay out its
        variants under ``scratch`` as push reads directories."""
        try:
            # its MLmodel first: a model without an ONNX flavour is not downloaded at all
            uri = f"{URI_PREFIX}{found.name}/{found.version}"
            flavors = self._mlflow.models.get_model_info(uri).flavors
            if "onnx" not in flavors or not flavors["onnx"].get("data"):
                raise MlflowSourceError(
                    f"{ref.uri}: MLflow version {found.version} has no ONNX flavour (its "
                    f"flavours: {', '.join(sorted(flavors)) or 'none'}); log it with "
                    "mlflow.onnx.log_model"
                )
            location = self.client.get_model_version_download_uri(found.name, found.version)
            downloaded = Path(
                self._mlflow.artifacts.download_artifacts(
                    artifact_uri=location,
                    dst_path=str(scratch / "mlflow"),
                    tracking_uri=self.tracking_uri,
                )
            )
        except (self._failure, OSError) as exc:
            raise self._failed(ref, exc) from exc
        model_file = downloaded / flavors["onnx"]["data"]
        if not model_file.is_file():
            raise MlflowSourceError(
                f"{ref.uri}: the ONNX flavour names {flavors['onnx']['data']}, which MLflow "
                "does not hold"
            )
        onnx_dir = scratch / "onnx"
        onnx_dir.mkdir()
        self_contained(model_file, onnx_dir / "model.onnx", ref)
        extras = downloaded / "extra_files"
        variants = [(onnx_dir, ref.profiles)]
        if extras.is_dir():
            variants += _take_extra_files(extras, onnx_dir, scratch / "openvino", ref)
        source = {
            "kind": "mlflow",
            "registered_model": found.name,
            "version": int(found.version),
            "run_id": found.run_id or None,
            "alias": ref.alias,
            "tracking_uri": self.shown_uri,
        }
        return Staged(source, variants)


def _take_extra_files(
    extras: Path, onnx_dir: Path, ir_dir: Path, ref: ModelRef
) -> list[tuple[Path, tuple[str, ...]]]:
    """Copy a pipeline's files and the samples from ``extras`` beside the ONNX model; return
    an OpenVINO IR found there as one more variant (with the same pipeline files)."""
    from common.pipeline_config import PIPELINE_FILES

    files = [f for f in sorted(extras.iterdir()) if f.is_file()]
    shared = [f for f in files if PIPELINE_FILES.match(f.name)]
    for f in shared + [f for f in files if f.name in _SAMPLES]:
        shutil.copyfile(f, onnx_dir / f.name)
    irs = [f for f in files if f.suffix == ".xml" and f.with_suffix(".bin").is_file()]
    if not irs:
        return []
    if len(irs) > 1:
        names = ", ".join(f.name for f in irs)
        raise MlflowSourceError(f"{ref.uri}: several OpenVINO IRs in extra_files ({names})")
    ir_dir.mkdir()
    for f in [*shared, irs[0], irs[0].with_suffix(".bin")]:
        shutil.copyfile(f, ir_dir / f.name)
    return [(ir_dir, ref.profiles)]


def self_contained(source: Path, target: Path, ref: ModelRef) -> None:
    """Write ``source`` to ``target`` as one ONNX file: as it is when it holds its weights,
    otherwise with its external data (the side files beside it) read back in. Protobuf caps a
    single file at 2 GB: a larger model is refused, not split."""
    import onnx
    from google.protobuf.message import DecodeError
    from onnx.external_data_helper import uses_external_data

    try:
        bare = onnx.load(source, load_external_data=False)
        tensors = [*bare.graph.initializer]
        tensors += [a.t for n in bare.graph.node for a in n.attribute if a.HasField("t")]
        if not any(uses_external_data(t) for t in tensors):
            shutil.copyfile(source, target)
            return
        onnx.save(onnx.load(source), target)
    except (OSError, ValueError) as exc:  # a side file missing; past 2 GB
        raise MlflowSourceError(f"{ref.uri}: cannot make one ONNX file of it: {exc}") from exc
    except DecodeError as exc:
        raise MlflowSourceError(f"{ref.uri}: {source.name} is not an ONNX model: {exc}") from exc


def pushed_from(versions: list[dict[str, Any]], found: Any) -> dict[str, Any] | None:
    """The version (as the API lists it) pushed from MLflow's ``found``, if one was."""
    for v in versions:
        source = v.get("source") or {}
        if (
            source.get("kind") == "mlflow"
            and source.get("registered_model") == found.name
            and source.get("version") == int(found.version)
        ):
            return v
    return None


def without_credentials(uri: str) -> str:
    """``uri`` with any user and password taken out: it is recorded and printed."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    netloc = parts.netloc.rpartition("@")[2]  # the host and port as written, unparsed
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def source_line(source: dict[str, Any]) -> str:
    """A version's provenance as ``models list`` and ``models sync`` print it."""
    via = f"@{source['alias']}, " if source.get("alias") else ""
    return (
        f"MLflow {source['registered_model']} v{source['version']} ({via}"
        f"run {source.get('run_id') or 'unknown'})"
    )
