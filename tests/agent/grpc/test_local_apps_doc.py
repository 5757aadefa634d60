"""docs/local-apps.md's Python snippets, run as written against a real agent (only the
addresses and the shared memory keys are swapped for the test's)."""

from __future__ import annotations

import contextlib
import io
import re
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.agent.grpc.conftest import GrpcAgent
from tests.agent.grpc.test_grpc_endpoints import ort_outputs

DOC = Path(__file__).parents[3] / "docs" / "local-apps.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_has_its_snippets() -> None:
    texts = snippets()
    assert len(texts) == 4
    assert sum("tritonclient.utils.shared_memory" in t for t in texts) == 2  # gRPC, REST


@pytest.mark.parametrize("index", range(4))
def test_snippet_runs_and_agrees_with_onnx_runtime(
    grpc_agent: GrpcAgent, example_repo: Path, index: int
) -> None:
    code = snippets()[index]
    code = code.replace("localhost:8000", grpc_agent.rest.url.removeprefix("http://"))
    code = code.replace("localhost:8001", grpc_agent.address)
    code = code.replace("/myapp-", f"/edgefleet-doc-{uuid.uuid4().hex[:8]}-")
    namespace: dict[str, object] = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(code, f"{DOC.name}[{index}]", "exec"), namespace)
    x, logits = namespace["x"], namespace["logits"]
    assert isinstance(x, np.ndarray) and isinstance(logits, np.ndarray)
    np.testing.assert_allclose(logits, ort_outputs(example_repo, "mlp", x), rtol=1e-5, atol=1e-5)
    assert str(int(logits.argmax())) in printed.getvalue()
