"""A pipeline version's drift reference, made at its own model: the reference set's inputs
(a JPEG's bytes, say) run through the version's steps, and what enters and leaves the model
kept as a reference set of its own (``model_reference.npz``, ``input:`` and ``output:``
named as the model names them, the labels as they were).

Devices sketch a pipeline at the same point (:func:`agent.inference.pipelined.sketched`), so
the drift monitor compares like with like: decoded, resized, normalised tensors on both sides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from common.pipeline_config import PIPELINE_FILE, parse_pipeline
from common.pipeline_steps import run_offline
from control_plane.registry.store import ArtifactStore
from runtimes.base import Runtime

MODEL_REFERENCE_FILE = "model_reference.npz"
BATCH_ROWS = 64
"""Reference rows run through the steps at a time."""


def model_step_reference(
    store: ArtifactStore, directory: Path, runtime: Runtime, reference: dict[str, Any]
) -> dict[str, Any]:
    """Run ``reference`` through the pipeline in ``directory`` with ``runtime`` as its model
    (blocking), store what its model saw and gave, and return that file's reference entry.

    Raises:
        PipelineConfigError, StepError, RuntimeFailure, ValueError, OSError, KeyError: the
            reference set (checked when it was uploaded), the steps or the model cannot run it.
    """
    with np.load(store.path(reference["sha256"]), allow_pickle=False) as data:
        inputs = {k[6:]: data[k] for k in data.files if k.startswith("input:")}
        labels = data["labels"] if "labels" in data.files else None
    rows = len(next(iter(inputs.values())))
    config = parse_pipeline((directory / PIPELINE_FILE).read_text(), PIPELINE_FILE)
    given: dict[str, list[np.ndarray]] = {}
    gave: dict[str, list[np.ndarray]] = {}

    def keep(inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        for seen, arrays in ((given, inputs), (gave, outputs)):
            for name, x in arrays.items():
                seen.setdefault(name, []).append(np.asarray(x))

    for start in range(0, rows, BATCH_ROWS):
        # an .npz holds bytes as fixed-width strings; the steps take BYTES as objects
        batch = {
            k: v[start : start + BATCH_ROWS].astype(object if v.dtype.kind == "S" else v.dtype)
            for k, v in inputs.items()
        }
        run_offline(config, directory, batch, runtime.signature, runtime.infer, keep)
    arrays = {
        f"{prefix}:{name}": np.concatenate(parts)
        for prefix, seen in (("input", given), ("output", gave))
        for name, parts in seen.items()
        if parts[0].dtype.kind in "biuf"  # numbers are sketched; BYTES are not
    }
    if labels is not None:
        arrays["labels"] = labels
    path = directory / MODEL_REFERENCE_FILE
    np.savez(path, **arrays)  # type: ignore[arg-type]
    sha, size = store.put_file(path)
    return {"name": MODEL_REFERENCE_FILE, "sha256": sha, "size": size}
