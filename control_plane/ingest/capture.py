"""Captured samples from devices' uploads into rows of ``captured_samples``.

Each sample's archive is decoded and opened as an ``.npz`` (no pickles) before it is stored:
what the export later hands to a training job is known to load. A sample that does not is
refused and named; the rest of its upload is stored.
"""

from __future__ import annotations

import base64
import binascii
import io
import zipfile
from typing import Any

import numpy as np

from common.protocol.capture import MAX_SAMPLE_BYTES, CaptureUpload
from control_plane.ingest.rows import utc

__all__ = ["TELEMETRY_TAGS", "CaptureUpload", "capture_rows"]
TELEMETRY_TAGS = ("telemetry", "capture", "diagnostic")
"""The tags of what a telemetry topic carries (:data:`common.protocol.capture.DeviceTelemetry`)."""


def check_archive(data: bytes) -> str | None:
    """Why ``data`` is not a sample's archive, or None."""
    if len(data) > MAX_SAMPLE_BYTES:
        return f"{len(data)} bytes exceed {MAX_SAMPLE_BYTES}"
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            names = list(archive.files)
            for name in names:
                archive[name]  # noqa: B018 (each array read: a corrupt one raises here)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        return f"not an .npz archive: {exc}"
    if not any(n.startswith(("input:", "output:")) for n in names):
        return "holds no input: or output: arrays"
    return None


def capture_rows(
    device_id: str, upload: CaptureUpload
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """The rows to store (without ``received_at``), and (sample id, why) of those refused."""
    rows, refused = [], []
    for sample in upload.samples:
        try:
            data = base64.b64decode(sample.data_b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            refused.append((sample.sample_id, f"data_b64: {exc}"))
            continue
        if why := check_archive(data):
            refused.append((sample.sample_id, f"data_b64: {why}"))
            continue
        rows.append(
            {
                "device_id": device_id,
                "sample_id": sample.sample_id,
                "model": sample.model,
                "version": sample.version,
                "captured_at": utc(sample.captured_at),
                "trigger": sample.trigger.value,
                "rows": sample.rows,
                "size_bytes": len(data),
                "data": data,
            }
        )
    return rows, refused
