"""The artifact store, as the control plane uses it to validate an upload: stored by digest,
linked under its own name into a scratch directory, loaded by the real runtime."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from control_plane.registry.store import ArtifactStore, read_signature


async def chunks_of(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 65536):
        yield data[i : i + 65536]


def test_a_store_under_a_relative_directory_links_files_that_load(
    example_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``artifact_dir`` relative to the working directory (the demo's ``var/demo/...``): the
    links made for validation pointed at that relative path from the scratch directory, where
    nothing was, and every upload was refused as not loading."""
    monkeypatch.chdir(tmp_path)
    store = ArtifactStore(Path("state") / "artifacts", max_bytes=10**8)
    data = (example_repo / "mlp" / "1" / "model.onnx").read_bytes()
    sha, size = asyncio.run(store.put(chunks_of(data)))
    assert (sha, size) == (hashlib.sha256(data).hexdigest(), len(data))
    variant = {"format": "onnx", "files": [{"name": "model.onnx", "sha256": sha}]}
    signature = read_signature(store, variant)
    assert [t["name"] for t in signature["inputs"]] == ["input"]
    assert signature["inputs"][0]["shape"][-1] == 256
