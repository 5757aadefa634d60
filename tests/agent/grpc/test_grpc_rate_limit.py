"""The rate limit holds for every gRPC message: unary calls and each request inside a stream
(one ModelStreamInfer stream once carried 300 requests past a limit of 5 a second). A refused
request inside a stream is answered with its reason and the stream stays open. Unmodified
tritonclient against a real agent."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.agent.grpc.conftest import grpc_settings
from tests.agent.server import copy_models, serve, wait_until

RATE_PER_S, BURST = 5.0, 5
UNARY = {"authorization": "Bearer 0123456789abcdef-grpc-unary"}
STREAM = {"authorization": "Bearer 0123456789abcdef-grpc-stream"}
"""A key, and so a full bucket, for each test: no waiting for one to refill first."""


@pytest.fixture(scope="module")
def address(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = copy_models(example_repo, tmp_path_factory.mktemp("repo"), "mlp")
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        grpc = grpc_settings(Path(short) / "agent.sock")
        limits = {"rate_limit_per_s": RATE_PER_S, "rate_limit_burst": BURST}
        keys = tmp_path_factory.mktemp("keys") / "api-keys"
        keys.write_text(
            "".join(
                f"{name}:{h['authorization'].split()[1]}\n"
                for name, h in (("unary", UNARY), ("stream", STREAM))
            )
        )
        with serve(repo, grpc=grpc, api_keys_file=keys, **limits):
            yield f"127.0.0.1:{grpc['port']}"


def _input() -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("input", [1, 256], "FP32")
    tensor.set_data_from_numpy(np.full((1, 256), 0.5, np.float32))
    return tensor


def _most_allowed(elapsed_s: float) -> int:
    """What a bucket of BURST tokens refilled at RATE_PER_S can give over ``elapsed_s``."""
    return BURST + int(RATE_PER_S * elapsed_s) + 1


def test_unary_calls_past_the_limit_are_refused(address: str) -> None:
    answered, refused = 0, []
    started = time.monotonic()
    with grpcclient.InferenceServerClient(address) as client:
        for _ in range(60):
            try:
                client.infer("mlp", [_input()], headers=UNARY)
                answered += 1
            except InferenceServerException as exc:
                refused.append(exc)
    assert 1 <= answered <= _most_allowed(time.monotonic() - started)
    assert refused and all(e.status() == "StatusCode.RESOURCE_EXHAUSTED" for e in refused)


def test_each_request_inside_a_stream_takes_a_token(address: str) -> None:
    answers: list[tuple[object, object]] = []
    started = time.monotonic()
    with grpcclient.InferenceServerClient(address) as client:
        client.start_stream(
            callback=lambda result, error: answers.append((result, error)), headers=STREAM
        )
        for i in range(300):
            client.async_stream_infer("mlp", [_input()], request_id=str(i))
        client.stop_stream()  # waits for every answer
    elapsed = time.monotonic() - started
    assert len(answers) == 300  # the stream stayed open to the end
    errors = [str(error) for result, error in answers if error is not None]
    answered = 300 - len(errors)
    assert 1 <= answered <= _most_allowed(elapsed), (answered, elapsed)
    assert all("rate_limit_per_s=5" in e for e in errors), errors[:3]
    # a token comes back at the rate: the limit refuses, it does not shut the client out
    with grpcclient.InferenceServerClient(address) as client:

        def served() -> bool:
            try:
                return client.infer("mlp", [_input()], headers=STREAM) is not None
            except InferenceServerException:
                return False  # refused: no token yet

        wait_until(served, timeout_s=10, what="a token back")
