"""The committed protobuf and gRPC code is what the pinned grpcio-tools makes of the protos."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.grpc.proto import regenerate


def test_generated_code_is_current(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is in the dev extra")
    written = regenerate.generate(tmp_path)
    assert [p.name for p in written] == list(regenerate.GENERATED)
    stale = [p.name for p in written if p.read_text() != (regenerate.HERE / p.name).read_text()]
    assert not stale, (
        f"{stale} differ from what the protos generate: run python -m agent.grpc.proto.regenerate"
        " with the grpcio-tools version pinned in pyproject's dev extra"
    )


def test_messages_stay_out_of_the_default_pool() -> None:
    """tritonclient registers the same names in protobuf's default pool: both load together."""
    import tritonclient.grpc as grpcclient

    from agent.grpc.proto import grpc_service_pb2 as ours

    theirs = grpcclient.service_pb2.ModelInferRequest(model_name="m", id="x")
    assert ours.ModelInferRequest.FromString(theirs.SerializeToString()).id == "x"
    assert ours.ModelInferRequest.DESCRIPTOR.file.pool is not theirs.DESCRIPTOR.file.pool
