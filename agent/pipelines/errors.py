"""Errors of pipeline steps: defined with the built-in steps in :mod:`common.pipeline_steps`
(the control plane runs those too), where their tree and codes are drawn."""

from common.pipeline_steps import (
    DecodeBusyError,
    ImageTooLargeError,
    StepCrashedError,
    StepError,
    StepFailedError,
    StepInputError,
    StepTimeoutError,
)

__all__ = [
    "DecodeBusyError",
    "ImageTooLargeError",
    "StepCrashedError",
    "StepError",
    "StepFailedError",
    "StepInputError",
    "StepTimeoutError",
]
