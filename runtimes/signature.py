"""Model signatures: what a loaded model takes and gives, and the check every backend shares.

Validation runs before a backend sees the inputs, so all backends reject the same mistakes
with the same message, and the agent can check a request before it joins a batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property

import numpy as np
from pydantic import BaseModel, ConfigDict

from runtimes.datatypes import from_numpy
from runtimes.errors import InputDatatypeError, InputNameError, InputShapeError

DYNAMIC = -1
"""Shape entry of a dimension whose size is only known per request."""


class TensorSpec(BaseModel):
    """One input or output: V2 datatype and shape, ``-1`` for a dynamic dimension."""

    model_config = ConfigDict(frozen=True)

    name: str
    datatype: str
    shape: tuple[int, ...]
    ranked: bool = True
    """False when the model declares no shape at all (unknown rank): ``shape`` is then ``()``
    and inputs of any shape pass the check; the backend judges them when it runs."""

    def describe_shape(self) -> str:
        return "[" + ", ".join(str(d) for d in self.shape) + "]"


class ModelSignature(BaseModel):
    """Inputs and outputs of a loaded model, in the model's order."""

    model_config = ConfigDict(frozen=True)

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @cached_property
    def batched(self) -> bool:
        """Dimension 0 of every input and output is dynamic, so rows can be batched."""
        tensors = self.inputs + self.outputs
        return bool(tensors) and all(t.shape and t.shape[0] == DYNAMIC for t in tensors)

    @cached_property
    def _inputs_by_name(self) -> dict[str, TensorSpec]:
        return {t.name: t for t in self.inputs}

    def input(self, name: str) -> TensorSpec:
        spec = self._inputs_by_name.get(name)
        if spec is not None:
            return spec
        raise InputNameError(
            f"unknown input {name!r}; the model takes {self.input_names()}", field=name
        )

    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def validate_inputs(self, inputs: Mapping[str, np.ndarray]) -> int | None:
        """Check names, datatypes and shapes; return the batch size (None if unbatched).

        Raises:
            InputNameError: an input is missing or not one of the model's.
            InputDatatypeError: an array's dtype differs from the declared datatype.
            InputShapeError: rank or a fixed dimension differs, or batch sizes disagree.
        """
        known = self._inputs_by_name
        for name in inputs:
            if name not in known:
                self.input(name)  # raises
        if len(inputs) != len(known):
            missing = [n for n in self.input_names() if n not in inputs]
            raise InputNameError(
                f"missing input {missing[0]!r}; the model takes {self.input_names()}",
                field=missing[0],
            )
        batch: int | None = None
        batched = self.batched
        for spec in self.inputs:
            array = inputs[spec.name]
            try:
                datatype = from_numpy(array.dtype)
            except KeyError:
                datatype = str(array.dtype)
            if datatype != spec.datatype:
                raise InputDatatypeError(
                    f"input {spec.name!r} has datatype {datatype}, the model expects "
                    f"{spec.datatype}",
                    field=spec.name,
                )
            _check_shape(spec, array.shape)
            if batched:
                rows = array.shape[0]
                if rows < 1:
                    raise InputShapeError(
                        f"input {spec.name!r} has an empty batch (dimension 0 is 0)",
                        field=spec.name,
                    )
                if batch is not None and rows != batch:
                    raise InputShapeError(
                        f"input {spec.name!r} has {rows} rows, other inputs have {batch}",
                        field=spec.name,
                    )
                batch = rows
        return batch


def _check_shape(spec: TensorSpec, shape: tuple[int, ...]) -> None:
    if not spec.ranked:
        return
    expected = spec.shape
    fits = len(shape) == len(expected) and all(
        want == DYNAMIC or want == got for want, got in zip(expected, shape, strict=True)
    )
    if not fits:
        got = "[" + ", ".join(str(d) for d in shape) + "]"
        raise InputShapeError(
            f"input {spec.name!r} has shape {got}, the model expects {spec.describe_shape()} "
            "(-1 is any size)",
            field=spec.name,
        )
