"""Regenerate the committed protobuf and gRPC code from the ``.proto`` files beside it.

Run ``python -m agent.grpc.proto.regenerate`` with grpcio-tools at the version pinned in
pyproject's dev extra; ``tests/agent/grpc/test_proto_current.py`` fails when the committed
files differ from what it writes.

The generated modules are rewritten in two ways:

- imports name this package (protoc writes ``import model_config_pb2``, a top-level module);
- the descriptors go into a private pool (:mod:`agent.grpc.proto.pool`), not protobuf's
  default one: tritonclient registers the same ``inference.*`` names there, and two copies
  of one name in one pool fail at import ("duplicate symbol", kserve/kserve#3099).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
PROTOS = ("model_config.proto", "grpc_service.proto")
GENERATED = (
    "model_config_pb2.py",
    "model_config_pb2.pyi",
    "grpc_service_pb2.py",
    "grpc_service_pb2.pyi",
    "grpc_service_pb2_grpc.py",
)
_PACKAGE = "agent.grpc.proto"
_TOP_LEVEL_IMPORT = re.compile(r"^import (model_config_pb2|grpc_service_pb2) as ", re.M)
_POOL_IMPORT = f"from {_PACKAGE}.pool import POOL as _private_pool\n"


def _rewrite(name: str, text: str) -> str:
    text = _TOP_LEVEL_IMPORT.sub(rf"from {_PACKAGE} import \1 as ", text)
    if name.endswith("_pb2.py"):
        default = "_descriptor_pool.Default().AddSerializedFile("
        if default not in text:
            raise RuntimeError(f"{name}: protoc's output changed shape ({default!r} is missing)")
        marker = "# @@protoc_insertion_point(imports)\n"
        text = text.replace(marker, marker + _POOL_IMPORT, 1)
        text = text.replace(default, "_private_pool.AddSerializedFile(")
    return text


def generate(target: Path) -> list[Path]:
    """Write the generated files into ``target``; returns their paths."""
    from grpc_tools import protoc  # a dev dependency: only regeneration needs it

    with tempfile.TemporaryDirectory() as raw:
        args = [
            "protoc",
            f"-I{HERE}",
            f"--python_out={raw}",
            f"--pyi_out={raw}",
            f"--grpc_python_out={raw}",
            *(str(HERE / p) for p in PROTOS),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed: " + " ".join(args))
        written = []
        for name in GENERATED:
            text = (Path(raw) / name).read_text()
            out = target / name
            out.write_text(_rewrite(name, text))
            written.append(out)
        return written


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(path)
