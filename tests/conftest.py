"""Session-wide fixtures: the example model repository, written once by the project's script."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimes.examples import write_example_repository


@pytest.fixture(scope="session")
def example_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("example-models")
    write_example_repository(root)
    return root
