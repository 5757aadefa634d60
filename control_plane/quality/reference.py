"""A version's reference set: inputs with expected outputs or labels, as one ``.npz``.

Keys: ``input:<name>`` for every model input (rows on the first axis), then ``labels`` (integer
class per row: quality is accuracy) and/or ``output:<name>`` (the expected FP32 outputs: quality
is agreement). Variants are calibrated and judged on it (:mod:`control_plane.quality.optimise`).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from control_plane.errors import Invalid

REFERENCE_FILE = "reference.npz"
MAX_ROWS = 100_000


@dataclass(frozen=True)
class ReferenceSet:
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    outputs: dict[str, np.ndarray]

    @property
    def rows(self) -> int:
        return len(next(iter(self.inputs.values())))

    def batches(self, size: int) -> list[dict[str, np.ndarray]]:
        return [
            {k: v[start : start + size] for k, v in self.inputs.items()}
            for start in range(0, self.rows, size)
        ]


def load_reference(path: Path) -> ReferenceSet:
    """Read and check a reference set; every problem is :class:`Invalid` saying what is wrong."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise Invalid(f"reference set: not a readable .npz ({exc})") from None
    inputs = {k[6:]: v for k, v in arrays.items() if k.startswith("input:")}
    outputs = {k[7:]: v for k, v in arrays.items() if k.startswith("output:")}
    labels = arrays.get("labels")
    unknown = set(arrays) - {f"input:{k}" for k in inputs} - {f"output:{k}" for k in outputs}
    unknown.discard("labels")
    if unknown:
        raise Invalid(f"reference set: unknown keys {sorted(unknown)} (input:*, output:*, labels)")
    if not inputs:
        raise Invalid("reference set: no input:<name> arrays")
    if labels is None and not outputs:
        raise Invalid("reference set: needs labels or output:<name> arrays to judge against")
    sizes = {len(v) for v in [*inputs.values(), *outputs.values()] if v.ndim} | (
        {len(labels)} if labels is not None and labels.ndim else set()
    )
    if len(sizes) != 1 or any(v.ndim == 0 for v in [*inputs.values(), *outputs.values()]):
        raise Invalid(f"reference set: arrays disagree on the number of rows ({sorted(sizes)})")
    rows = sizes.pop()
    if not 1 <= rows <= MAX_ROWS:
        raise Invalid(f"reference set: {rows} rows; between 1 and {MAX_ROWS} expected")
    if labels is not None and (labels.ndim != 1 or labels.dtype.kind not in "iu"):
        raise Invalid("reference set: labels must be one integer class per row")
    return ReferenceSet(inputs, labels, outputs)
