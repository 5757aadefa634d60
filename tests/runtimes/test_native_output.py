"""A native library's lines on descriptor 2 while a model loads become log records."""

from __future__ import annotations

import logging
import os

import pytest

from runtimes.native_output import logged_stderr


def test_lines_on_descriptor_2_are_logged_and_json_is_passed_through(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger="test.native")
    with logged_stderr(logging.getLogger("test.native"), "litert"):
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
        os.write(2, b'{"level": "INFO", "message": "another thread\'s record"}\n')
    assert [(r.getMessage(), r.__dict__["source"]) for r in caplog.records] == [
        ("INFO: Created TensorFlow Lite XNNPACK delegate for CPU.", "litert")
    ]
    assert '"another thread\'s record"' in capfd.readouterr().err
    os.write(2, b"after\n")  # descriptor 2 is the process's own again
    assert capfd.readouterr().err == "after\n"
