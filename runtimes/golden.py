"""Golden samples: an input with its expected output, used for warm-up and self-tests.

Stored as one ``.npz`` file (``input:<name>`` and ``output:<name>`` arrays plus the
tolerances), so a manifest can name it by digest like any other artifact.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runtimes.errors import ModelFileError

GOLDEN_FILE = "golden.npz"


@dataclass(frozen=True)
class GoldenSample:
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    rtol: float = 1e-4
    atol: float = 1e-4
    extra: dict[str, str] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        # BYTES (object) arrays are stored as fixed-width bytes: npz must not need pickle.
        arrays = {f"input:{k}": _storable(v) for k, v in self.inputs.items()}
        arrays |= {f"output:{k}": _storable(v) for k, v in self.outputs.items()}
        arrays["rtol"] = np.array(self.rtol)
        arrays["atol"] = np.array(self.atol)
        with path.open("wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]

    @classmethod
    def load(cls, path: Path) -> GoldenSample:
        try:
            with np.load(path, allow_pickle=False) as data:
                inputs = {k[6:]: _loaded(data[k]) for k in data.files if k.startswith("input:")}
                outputs = {k[7:]: _loaded(data[k]) for k in data.files if k.startswith("output:")}
                rtol = float(data["rtol"]) if "rtol" in data.files else 1e-4
                atol = float(data["atol"]) if "atol" in data.files else 1e-4
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise ModelFileError(f"golden file {path} cannot be read: {exc}") from exc
        if not inputs or not outputs:
            raise ModelFileError(f"golden file {path} holds no inputs or no outputs")
        return cls(inputs=inputs, outputs=outputs, rtol=rtol, atol=atol)

    def mismatches(self, actual: Mapping[str, np.ndarray]) -> list[str]:
        """Why ``actual`` differs from the expected outputs; empty when it matches."""
        problems = []
        for name, expected in self.outputs.items():
            got = actual.get(name)
            if got is None:
                problems.append(f"output {name!r} is missing")
            elif got.shape != expected.shape:
                problems.append(
                    f"output {name!r} has shape {list(got.shape)}, expected {list(expected.shape)}"
                )
            elif expected.dtype == object:
                if not np.array_equal(got, expected):
                    problems.append(f"output {name!r} differs: {got.tolist()!r}")
            elif not np.allclose(got, expected, rtol=self.rtol, atol=self.atol):
                worst = float(np.max(np.abs(got.astype(np.float64) - expected)))
                problems.append(
                    f"output {name!r} differs by up to {worst:.3g} "
                    f"(rtol={self.rtol}, atol={self.atol})"
                )
        return problems


def _storable(array: np.ndarray) -> np.ndarray:
    if array.dtype == object:
        return np.array(
            [x if isinstance(x, bytes) else str(x).encode() for x in array.reshape(-1)],
            dtype=np.bytes_,
        ).reshape(array.shape)
    return array


def _loaded(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind == "S":
        out = np.empty(array.shape, dtype=object)
        out.reshape(-1)[:] = [bytes(x) for x in array.reshape(-1)]
        return out
    return array
