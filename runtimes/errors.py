"""Errors raised by the runtimes package.

Every backend translates its own exceptions (onnxruntime, OpenVINO, LiteRT) into this tree
at the boundary, with ``raise ... from exc`` so the original stays in the traceback::

    RuntimeFailure                  code
    +-- ModelFileError              model_invalid        missing, truncated or corrupt file
    +-- UnsupportedModelError       model_unsupported    operator or format the backend cannot run
    +-- InvalidInputError           invalid_input        the caller sent something wrong
    |   +-- InputNameError          invalid_input_name
    |   +-- InputDatatypeError      invalid_input_datatype
    |   +-- InputShapeError         invalid_input_shape
    +-- DeviceUnavailableError      device_unavailable   device or execution provider missing
    +-- RuntimeNotInstalledError    runtime_not_installed
    +-- NoPlacementError            no_placement         no profile candidate fits a model
    +-- ProfileError                profile_invalid      a hardware profile file is wrong
    +-- InferenceFailedError        inference_failed     the backend failed while running

Codes are stable and machine-readable; HTTP and MQTT adapters map them, the domain never
knows about transports.
"""

from __future__ import annotations

from pydantic import ValidationError


class RuntimeFailure(Exception):
    """Base of every error raised by :mod:`runtimes`."""

    code = "runtime_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelFileError(RuntimeFailure):
    """The model file is missing, truncated or not a valid model of its format."""

    code = "model_invalid"


class UnsupportedModelError(RuntimeFailure):
    """The model uses an operator, type or format that the backend cannot run."""

    code = "model_unsupported"


class InvalidInputError(RuntimeFailure):
    """The inputs do not match the model's signature."""

    code = "invalid_input"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InputNameError(InvalidInputError):
    code = "invalid_input_name"


class InputDatatypeError(InvalidInputError):
    code = "invalid_input_datatype"


class InputShapeError(InvalidInputError):
    code = "invalid_input_shape"


class DeviceUnavailableError(RuntimeFailure):
    """The requested device or execution provider is not present or not usable."""

    code = "device_unavailable"


class RuntimeNotInstalledError(RuntimeFailure):
    """The backend's Python package is not installed."""

    code = "runtime_not_installed"


class NoPlacementError(RuntimeFailure):
    """No candidate of the hardware profile (or the pinned one) can run the model."""

    code = "no_placement"


class ProfileError(RuntimeFailure):
    """A hardware profile file is invalid, or no profile matches the machine."""

    code = "profile_invalid"


class InferenceFailedError(RuntimeFailure):
    """The backend failed while running a batch whose inputs were valid."""

    code = "inference_failed"


def validation_message(exc: ValidationError) -> str:
    """``field a.b.0: message`` for the first error of a pydantic validation."""
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"] if p != "[key]") or "(top level)"
    return f"field {field}: {first['msg']}"
