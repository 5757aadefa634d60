"""A failed request is one log line; a bug's traceback once a minute per distinct error.
Thread-free: the clock is stepped by hand."""

from __future__ import annotations

import logging

import pytest

from agent.serving.failures import FailureLog
from runtimes.errors import InferenceFailedError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def failures(caplog: pytest.LogCaptureFixture) -> tuple[FailureLog, Clock]:
    caplog.set_level(logging.ERROR, logger="test.failures")
    clock = Clock()
    return FailureLog(logging.getLogger("test.failures"), clock), clock


def test_a_classified_failure_is_one_line_with_its_code(
    failures: tuple[FailureLog, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, _ = failures
    for _ in range(3):
        log.failed("request failed", InferenceFailedError("onnxruntime: bad index"), path="/x")
    assert len(caplog.records) == 3
    assert all(r.exc_info is None for r in caplog.records)
    assert caplog.records[0].__dict__["code"] == "inference_failed"
    assert "bad index" in caplog.records[0].__dict__["error"]


def test_a_bugs_traceback_once_a_minute_per_distinct_error(
    failures: tuple[FailureLog, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, clock = failures
    log.failed("request failed", KeyError("a"))
    clock.now += 30
    log.failed("request failed", KeyError("a"))  # the same bug: no traceback again
    log.failed("request failed", KeyError("b"))  # another: its own
    clock.now += 31
    log.failed("request failed", KeyError("a"))  # a minute on: again
    with_traceback = [r.exc_info is not None for r in caplog.records]
    assert with_traceback == [True, False, True, True]
    assert caplog.records[1].__dict__["traceback"] == "logged in the last minute"
