"""Errors of the control plane's services; ``control_plane/api/deps.py`` maps them to HTTP::

ControlPlaneError        code
+-- NotFound             not_found
+-- Invalid              invalid_request      names the field
|   +-- Unprocessable    unprocessable        well formed, but not what it must be (a file
|                                             that is no release tree)
+-- Conflict             conflict             a version that exists, an unvalidated rollout
|   +-- Busy             busy                 another rollout of the model is still active there
+-- TooLarge             payload_too_large    over max_json_body_bytes or max_upload_bytes
+-- Unauthorized         unauthorized
+-- Forbidden            forbidden
"""

from __future__ import annotations


class ControlPlaneError(Exception):
    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ControlPlaneError):
    code = "not_found"


class Invalid(ControlPlaneError):
    code = "invalid_request"


class Unprocessable(Invalid):
    code = "unprocessable"


class Conflict(ControlPlaneError):
    code = "conflict"


class Busy(Conflict):
    """Refused for now: it can go ahead once what is in the way finished (a caller that
    reconciles, as the Kubernetes controller does, tries again)."""

    code = "busy"


class TooLarge(ControlPlaneError):
    code = "payload_too_large"


class Unauthorized(ControlPlaneError):
    code = "unauthorized"


class Forbidden(ControlPlaneError):
    code = "forbidden"
