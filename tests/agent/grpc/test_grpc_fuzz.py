"""Bad input over gRPC, as over REST: malformed protobuf, generated requests, oversized
messages and impossible shapes get a client-error status, never INTERNAL, a crash or a hang,
and memory stays bounded."""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.grpc.proto import grpc_service_pb2 as pb
from tests.agent.grpc.conftest import GrpcAgent
from tests.rss import PeakRss

CLIENT_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
_INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def channel(grpc_agent: GrpcAgent) -> Iterator[grpc.Channel]:
    options = [("grpc.max_send_message_length", 64 * 2**20)]  # let oversized ones leave us
    with grpc.insecure_channel(grpc_agent.address, options=options) as opened:
        yield opened


def call(channel: grpc.Channel, body: bytes, method: str = _INFER) -> grpc.StatusCode:
    """The status of one raw call (bytes in); a hang fails by its timeout."""
    try:
        channel.unary_unary(method)(body, timeout=20)
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        assert code != grpc.StatusCode.DEADLINE_EXCEEDED, "the agent did not answer"
        return code
    return grpc.StatusCode.OK


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xff\xff\xff",  # a field number of 0 and a truncated varint
        b"\x0a\x80\x80\x80\x80\x10",  # a string whose length runs past the message
        b"\x12\x05mlp",  # a truncated string
        b"\x0a\x03mlp\x22\xff\x01",  # an input whose bytes are cut short
    ],
)
def test_malformed_protobuf_is_invalid_argument(channel: grpc.Channel, body: bytes) -> None:
    assert call(channel, body) == grpc.StatusCode.INVALID_ARGUMENT
    meta = "/inference.GRPCInferenceService/ModelMetadata"
    assert call(channel, body, meta) == grpc.StatusCode.INVALID_ARGUMENT


def request(model: str, shape: list[int], datatype: str = "FP32", raw: bytes = b"") -> bytes:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="input", datatype=datatype, shape=shape)
    message.raw_input_contents.append(raw)
    return message.SerializeToString()


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (request("nope", [1, 256], raw=bytes(1024)), grpc.StatusCode.NOT_FOUND),
        (request("mlp", [1, 255], raw=bytes(1020)), grpc.StatusCode.INVALID_ARGUMENT),
        (request("mlp", [1, 256], raw=bytes(1000)), grpc.StatusCode.INVALID_ARGUMENT),
        (request("mlp", [1, 256], "FP64", bytes(2048)), grpc.StatusCode.INVALID_ARGUMENT),
        (request("mlp", [2**31, 2**31], raw=bytes(8)), grpc.StatusCode.INVALID_ARGUMENT),
        (request("mlp", [1, 256], "BF17", bytes(1024)), grpc.StatusCode.INVALID_ARGUMENT),
        (request("mlp", [1] * 40, raw=bytes(4)), grpc.StatusCode.INVALID_ARGUMENT),
        # 5 MiB against the 4 MiB max_receive_message_bytes of the test agent
        (request("mlp", [5 * 1024, 256], raw=bytes(5 * 2**20)), grpc.StatusCode.RESOURCE_EXHAUSTED),
    ],
)
def test_bad_requests_get_their_status(
    channel: grpc.Channel, body: bytes, status: grpc.StatusCode
) -> None:
    assert call(channel, body) == status


_DATATYPES = st.sampled_from(
    ["FP32", "FP16", "FP64", "INT64", "INT8", "UINT8", "BOOL", "BYTES", "", "X"]
)
_PARAM = st.one_of(
    st.builds(lambda v: pb.InferParameter(int64_param=v), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: pb.InferParameter(string_param=v), st.text(max_size=8)),
    st.builds(lambda v: pb.InferParameter(bool_param=v), st.booleans()),
    st.builds(lambda v: pb.InferParameter(double_param=v), st.floats(allow_nan=True)),
)
_PARAM_KEYS = st.sampled_from(
    [
        "priority",
        "timeout",
        "sequence_id",
        "classification",
        "shared_memory_region",
        "shared_memory_byte_size",
        "shared_memory_offset",
        "binary_data_output",
    ]
)


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(
        model_name=draw(st.sampled_from(["mlp", "cnn", "nope", ""])),
        model_version=draw(st.sampled_from(["", "1", "2", "x"])),
        id=draw(st.text(max_size=4)),
    )
    for key, value in draw(st.dictionaries(_PARAM_KEYS, _PARAM, max_size=2)).items():
        message.parameters[key].CopyFrom(value)
    for _ in range(draw(st.integers(0, 3))):
        tensor = message.inputs.add(
            name=draw(st.sampled_from(["input", "x", ""])),
            datatype=draw(_DATATYPES),
            shape=draw(st.lists(st.integers(-2, 300), max_size=4)),
        )
        for key, value in draw(st.dictionaries(_PARAM_KEYS, _PARAM, max_size=2)).items():
            tensor.parameters[key].CopyFrom(value)
        if draw(st.booleans()):
            tensor.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=8)))
        if draw(st.booleans()):
            tensor.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=4), max_size=3)))
    for _ in range(draw(st.integers(0, 3))):
        message.raw_input_contents.append(draw(st.binary(max_size=1100)))
    for _ in range(draw(st.integers(0, 2))):
        out = message.outputs.add(name=draw(st.sampled_from(["logits", "y"])))
        for key, value in draw(st.dictionaries(_PARAM_KEYS, _PARAM, max_size=2)).items():
            out.parameters[key].CopyFrom(value)
    return message


@pytest.mark.slow
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message=infer_requests())
def test_generated_requests_never_fail_the_server(
    channel: grpc.Channel, message: pb.ModelInferRequest
) -> None:
    assert call(channel, message.SerializeToString()) in CLIENT_ERRORS | {grpc.StatusCode.OK}


@pytest.mark.slow
def test_generated_bytes_and_big_bodies_keep_memory_bounded(channel: grpc.Channel) -> None:
    rng = np.random.default_rng(7)
    oversized = request("mlp", [5 * 1024, 256], raw=bytes(5 * 2**20))
    statuses = set()
    with PeakRss(os.getpid()) as rss:
        for i in range(200):
            body = rng.bytes(int(rng.integers(1, 4096)))
            statuses.add(call(channel, body))
            if i % 20 == 0:
                assert call(channel, oversized) == grpc.StatusCode.RESOURCE_EXHAUSTED
    # random bytes parse as unknown fields at times: a request without inputs, refused alike
    assert statuses <= CLIENT_ERRORS
    assert rss.growth < 64 * 2**20, f"grew by {rss.growth / 2**20:.0f} MiB"
