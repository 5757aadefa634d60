"""What the control plane's API must refuse with a 4xx rather than pass to the database, on
SQLite and PostgreSQL (which, unlike SQLite, enforces column widths): names past their column,
and the same version created by two requests at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.control_plane.conftest import ControlPlaneFactory

VERSION = {"version": 1, "variants": [{"format": "onnx", "profiles": []}]}


def test_names_longer_than_their_column_are_400s_naming_the_field(
    start_control_plane: ControlPlaneFactory,
) -> None:
    with start_control_plane() as cp:
        resp = cp.admin.post(f"/api/v1/models/{'m' * 129}/versions", json=VERSION)
        assert resp.status_code == 400 and resp.json()["error"].startswith("name:"), resp.text
        resp = cp.admin.post("/api/v1/tokens", json={"name": "t" * 129, "role": "viewer"})
        assert resp.status_code == 400 and resp.json()["error"].startswith("name:"), resp.text
        assert (
            cp.admin.post(f"/api/v1/models/{'m' * 128}/versions", json=VERSION).status_code == 201
        )


def test_one_version_created_by_many_requests_at_once_is_one_201_and_409s(
    start_control_plane: ControlPlaneFactory,
) -> None:
    with (
        start_control_plane() as cp,
        cp.client(cp.token("operator")) as client,
        ThreadPoolExecutor(8) as pool,
    ):
        for name in ("race-a", "race-b", "race-c"):  # the model is new too: two rows to race
            url = f"/api/v1/models/{name}/versions"
            answers = list(pool.map(lambda u: client.post(u, json=VERSION), [url] * 8))
            statuses = sorted(a.status_code for a in answers)
            assert statuses == [201] + [409] * 7, [a.text for a in answers]
