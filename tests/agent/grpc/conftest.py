"""A real agent with gRPC on, on a TCP port of 127.0.0.1 and a Unix socket, serving the
example models; and tritonclient's gRPC client for it."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from tests.agent.server import RunningAgent, copy_models, serve

MODELS = ("mlp", "cnn")


@dataclass
class GrpcAgent:
    rest: RunningAgent
    address: str
    """host:port of the gRPC endpoint."""
    uds: Path

    def client(self, unix: bool = False) -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(f"unix:{self.uds}" if unix else self.address)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def grpc_settings(uds: Path, **extra: object) -> dict[str, object]:
    return {"enabled": True, "port": free_port(), "uds": uds, **extra}


@pytest.fixture(scope="module")
def grpc_agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcAgent]:
    repo = copy_models(example_repo, tmp_path_factory.mktemp("repo"), *MODELS)
    with tempfile.TemporaryDirectory(dir="/tmp") as short:  # a socket path has 108 bytes
        uds = Path(short) / "agent.sock"
        grpc = grpc_settings(uds, max_receive_message_bytes=4 * 2**20)
        with serve(repo, grpc=grpc) as running:
            yield GrpcAgent(running, f"127.0.0.1:{grpc['port']}", uds)


@pytest.fixture(scope="module")
def client(grpc_agent: GrpcAgent) -> Iterator[grpcclient.InferenceServerClient]:
    with grpc_agent.client() as c:
        yield c
