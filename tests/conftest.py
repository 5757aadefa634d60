"""Session-wide fixtures: the example model repository, written once by the project's script.
And how ``pytest -n 2`` (pytest-xdist) shares the suite between its workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtimes.examples import write_example_repository

# the OTLP/HTTP receiver fixture (``receiver``) the agent's and the control plane's tracing
# tests share
pytest_plugins = ["tests.otlp"]


@pytest.fixture(scope="session")
def example_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("example-models")
    write_example_repository(root)
    return root


# Folders whose tests share one costly fixture (a browser and a fleet, a built wheel, a trained
# model with its control plane): each runs whole on one worker, so the fixture is built once
WHOLE_FOLDERS = ("tests/control_plane/console/", "tests/packaging/", "tests/control_plane/quality/")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under xdist, a file's tests run on one worker (module fixtures are built once) and so
    do the folders above; files go to whichever worker is free."""
    from xdist.scheduler import LoadScopeScheduling

    class FileOrFolder(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((folder for folder in WHOLE_FOLDERS if path.startswith(folder)), path)

    return FileOrFolder(config, log)
