"""What a native library prints on the process's stderr while a model loads, caught and logged.

LiteRT prints ``INFO: Created TensorFlow Lite XNNPACK delegate for CPU.`` on file descriptor 2
at every interpreter it builds, past Python's logging: a line that is not JSON in a log where
every other line is. :func:`logged_stderr` points descriptor 2 at a file while the block runs
and then logs each line the library wrote as a record of its own. Lines that were already JSON
(another thread's log record, written meanwhile) are written back as they were.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_SWAP = threading.Lock()
"""Descriptor 2 is the process's: one swap at a time."""


@contextmanager
def logged_stderr(log: logging.Logger, source: str) -> Iterator[None]:
    with _SWAP, tempfile.TemporaryFile() as caught:
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            _replay(caught.read().decode("utf-8", "replace"), log, source)


def _replay(text: str, log: logging.Logger, source: str) -> None:
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError:
            log.info(line.strip(), extra={"source": source})
        else:
            os.write(2, (line + "\n").encode())
