"""How the control plane appends a device's answer: only at the offset it holds, within the
declared size and the request's cap; a device's error or a changed size fails the request."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

from common.protocol.diagnostics import DiagnosticUpload
from control_plane.db.models import DeviceDiagnostic
from control_plane.ingest.diagnostics import append_chunk

NOW = datetime(2026, 12, 7, tzinfo=UTC)


def row(max_bytes: int = 100) -> DeviceDiagnostic:
    return DeviceDiagnostic(
        id="r1",
        device_id="d",
        kind="logs",
        params={"max_bytes": max_bytes},
        requested_by="op",
        requested_at=NOW,
        expires_at=NOW,
        state="pending",
        received_bytes=0,
        data=b"",
    )


def chunk(offset: int, data: bytes, total: int, error: str = "") -> DiagnosticUpload:
    return DiagnosticUpload(
        device_id="d",
        request_id="r1",
        offset=offset,
        total_bytes=total,
        data_b64=base64.b64encode(data).decode(),
        error=error,
    )


def test_chunks_append_at_the_held_offset_only() -> None:
    r = row()
    append_chunk(r, chunk(0, b"abc", 6))
    assert (r.state, r.data, r.received_bytes) == ("uploading", b"abc", 3)
    append_chunk(r, chunk(0, b"abc", 6))  # a resend of what is held
    append_chunk(r, chunk(5, b"f", 6))  # past a gap
    assert r.data == b"abc"
    append_chunk(r, chunk(3, b"def", 6))
    assert (r.state, r.data, r.total_bytes) == ("complete", b"abcdef", 6)


def test_a_cap_a_changed_size_an_overrun_and_the_devices_error_fail_it() -> None:
    r = row(max_bytes=5)
    append_chunk(r, chunk(0, b"abc", 6))
    assert r.state == "failed" and "exceed max_bytes 5" in (r.error or "")
    r = row()
    append_chunk(r, chunk(0, b"abc", 6))
    append_chunk(r, chunk(3, b"def", 7))
    assert r.state == "failed" and "total_bytes changed" in (r.error or "")
    r = row()
    append_chunk(r, chunk(0, b"abcdefg", 6))
    assert r.state == "failed" and "past total_bytes" in (r.error or "")
    r = row()
    append_chunk(r, chunk(0, b"", 0, error="PermissionError: logs"))
    assert r.state == "failed" and r.error == "the device: PermissionError: logs"
