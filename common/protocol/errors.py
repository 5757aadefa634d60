"""Why a message or manifest was refused. Codes are stable: devices report them in events,
the control plane counts them, and they match the agent's other error codes in style."""

from __future__ import annotations

from enum import StrEnum


class Rejection(StrEnum):
    MALFORMED = "malformed"
    UNSUPPORTED_SCHEMA = "unsupported_schema"
    UNKNOWN_KEY = "unknown_key"
    REVOKED_KEY = "revoked_key"
    BAD_SIGNATURE = "bad_signature"
    INSUFFICIENT_SIGNATURES = "insufficient_signatures"
    EXPIRED = "expired"
    NOT_YET_VALID = "not_yet_valid"
    REPLAYED = "replayed"
    WRONG_TARGET = "wrong_target"
    NO_ARTIFACT = "no_artifact"
    DIGEST_MISMATCH = "digest_mismatch"
    SIZE_MISMATCH = "size_mismatch"
    OVERSIZE = "oversize"
    DOWNLOAD_FAILED = "download_failed"
    DISK_FULL = "disk_full"
    LOAD_FAILED = "load_failed"
    SELF_TEST_FAILED = "self_test_failed"
    HEALTH_CHECK_FAILED = "health_check_failed"
    FLEET_COMMAND = "fleet_command"
    NOTHING_TO_ROLL_BACK = "nothing_to_roll_back"
    SUPERSEDED = "superseded"
    NO_LAUNCHER = "no_launcher"
    """An agent release sent to an agent that does not run under the launcher."""


class ProtocolError(Exception):
    """A message that must not be acted on, with the machine-readable reason."""

    def __init__(
        self,
        code: Rejection,
        message: str,
        *,
        model: str | None = None,
        sequence: int | None = None,
    ) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.model = model
        self.sequence = sequence
