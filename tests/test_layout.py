"""Each process imports only what it runs: the control plane loads no module of the agent, the
agent none of the control plane, and the shared kernel (``common``) neither. Checked in fresh
interpreters, since this test session has imported everything."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.packaging.conftest import ROOT


def loaded_packages(*modules: str) -> set[str]:
    """The top-level packages of every module loaded by importing ``modules``."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out))


def of_package(modules: set[str], package: str) -> list[str]:
    return sorted(m for m in modules if m == package or m.startswith(package + "."))


CONTROL_PLANE_ENTRIES = (
    "control_plane.main",
    "control_plane.cli",
    "control_plane.demo",
    "control_plane.api.app",
    "control_plane.registry.validation",
    "control_plane.k8s.lifespan",
    "control_plane.provisioning.cli",
)
AGENT_ENTRIES = ("agent.main", "agent.cli", "agent.fleet.client", "agent.selftest")


def test_the_control_plane_loads_no_agent_module() -> None:
    loaded = loaded_packages(*CONTROL_PLANE_ENTRIES)
    assert "control_plane.main" in loaded  # the check ran
    assert not of_package(loaded, "agent"), of_package(loaded, "agent")


def test_the_agent_loads_no_control_plane_module() -> None:
    loaded = loaded_packages(*AGENT_ENTRIES)
    assert "agent.main" in loaded
    assert not of_package(loaded, "control_plane"), of_package(loaded, "control_plane")


@pytest.mark.parametrize("side", ["agent", "control_plane", "benchmarks"])
def test_the_shared_kernel_loads_neither_side(side: str) -> None:
    kernel = [f"common.{p.stem}" for p in (ROOT / "common").glob("*.py") if p.stem != "__init__"]
    kernel += [f"common.protocol.{p.stem}" for p in (ROOT / "common" / "protocol").glob("*.py")]
    loaded = loaded_packages(*kernel)
    assert "common.protocol.verify" in loaded and "common.cli" in loaded
    assert not of_package(loaded, side), of_package(loaded, side)


def test_no_product_package_imports_the_benchmarks() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("common", "agent", "control_plane", "runtimes")
        for path in (ROOT / package).rglob("*.py")
        if "import benchmarks" in (text := path.read_text()) or "from benchmarks" in text
    ]
    assert not offenders
