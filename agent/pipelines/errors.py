"""Errors of pipeline steps; ``agent/api/errors.py`` maps them to statuses::

    AgentError (agent.errors)
    +-- RequestError
    |   +-- StepInputError        step_input_invalid    400: what a step got is not usable
    +-- PayloadTooLargeError
    |   +-- ImageTooLargeError    image_too_large       413: past pipelines.max_image_pixels
    +-- StepFailedError           step_failed           422: a step raised (its message)
    +-- StepCrashedError          step_crashed          502: a Python step's worker died
    +-- StepTimeoutError          step_timeout          504: a step passed its timeout

Each message names the step.
"""

from __future__ import annotations

from agent.errors import AgentError, PayloadTooLargeError, RequestError


class StepInputError(RequestError):
    code = "step_input_invalid"


class ImageTooLargeError(PayloadTooLargeError):
    code = "image_too_large"


class StepFailedError(AgentError):
    code = "step_failed"


class StepCrashedError(AgentError):
    code = "step_crashed"


class StepTimeoutError(AgentError):
    code = "step_timeout"
