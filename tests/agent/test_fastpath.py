"""The V2 infer fast path recognises exactly the two infer routes; everything else goes through
the router as before (a real agent answers both ways the same)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.api.fastpath import infer_route
from tests.agent.server import copy_models, serve


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/v2/models/mlp/infer", ("mlp", None)),
        ("/v2/models/mlp/versions/3/infer", ("mlp", "3")),
        ("/v2/models//infer", None),
        ("/v2/models/mlp/versions//infer", None),
        ("/v2/models/mlp/ready", None),
        ("/v2/models/mlp/infer/", None),
        ("/v2/models/a/b/infer", None),
        ("/v1/models/mlp/infer", None),
        ("/v2/models/mlp/versions/3/extra/infer", None),
    ],
)
def test_infer_route(path: str, route: tuple[str, str | None] | None) -> None:
    assert infer_route(path) == route


def test_fast_path_and_router_agree(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    body = {
        "inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": [0.5] * 256}]
    }
    with serve(repo) as agent:
        c = agent.client
        latest = c.post("/v2/models/mlp/infer", json=body)
        pinned = c.post("/v2/models/mlp/versions/1/infer", json=body)
        assert latest.status_code == pinned.status_code == 200
        assert latest.json()["outputs"] == pinned.json()["outputs"]
        assert latest.headers["x-request-id"] and "traceparent" in latest.headers
        missing = c.post("/v2/models/nope/infer", json=body)
        assert missing.status_code == 404 and "nope" in missing.json()["error"]
        assert c.get("/v2/models/mlp/infer").status_code == 405  # not POST: the router answers
        bad = c.post("/v2/models/mlp/infer", content=b"{")
        assert bad.status_code == 400
