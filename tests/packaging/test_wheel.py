"""``python -m build`` makes the sdist and the wheel; the wheel carries the hardware profiles and
installs into a clean virtual environment, where ``edgefleet --version`` and hardware detection
work from the installed files alone."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from common import __version__
from tests.packaging.conftest import ROOT, Dist

pytestmark = pytest.mark.slow

PROFILES = sorted(p.name for p in (ROOT / "hardware_profiles").glob("*.toml"))


def test_build_makes_a_wheel_and_an_sdist_of_this_version(dist: Dist) -> None:
    assert dist.wheel.name == f"edgefleet-{__version__}-py3-none-any.whl"
    assert dist.sdist.name == f"edgefleet-{__version__}.tar.gz"


def test_wheel_carries_the_packages_profiles_and_entry_points(dist: Dist) -> None:
    with zipfile.ZipFile(dist.wheel) as whl:
        names = set(whl.namelist())
        profiles_dir = "runtimes/hardware/profiles/"
        shipped = sorted(n.removeprefix(profiles_dir) for n in names if n.startswith(profiles_dir))
        assert shipped == PROFILES and PROFILES
        for name in PROFILES:  # the files themselves, not only their names
            expected = (ROOT / "hardware_profiles" / name).read_bytes()
            assert whl.read(profiles_dir + name) == expected
        for module in (
            "common/cli.py",
            "agent/cli.py",
            "agent/systemd.py",
            "runtimes/backends/__init__.py",
            "control_plane/cli/__init__.py",
            "common/protocol/__init__.py",
        ):
            assert module in names
        assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]
        info = f"edgefleet-{__version__}.dist-info"
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
        metadata = Parser().parsestr(whl.read(f"{info}/METADATA").decode())
    assert "edgefleet = common.cli:main" in entry_points
    assert "agent = agent.cli:register_agent" in entry_points
    assert metadata["Version"] == __version__
    requires = metadata.get_all("Requires-Dist") or []
    assert any(r.startswith("onnxruntime") for r in requires)
    assert any(r.startswith("openvino") and "extra == 'openvino'" in r for r in requires)


def test_wheel_carries_no_benchmark(dist: Dist) -> None:
    """Benchmarks are for the project, not for devices (benchmarks/, outside the packages)."""
    with zipfile.ZipFile(dist.wheel) as whl:
        names = whl.namelist()
    benchmark_files = [
        n
        for n in names
        if n.startswith("benchmarks/") or "/bench/" in n or Path(n).stem.endswith("bench")
    ]
    assert not benchmark_files, f"benchmark code in the wheel: {benchmark_files}"
    assert "benchmarks/__init__.py" in {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "benchmarks").glob("*.py")
    }, "the benchmarks moved: update this test"
    entry_points = whl_entry_points(dist)
    assert not [line for line in entry_points.splitlines() if line.startswith("bench")]


def whl_entry_points(dist: Dist) -> str:
    with zipfile.ZipFile(dist.wheel) as whl:
        return whl.read(f"edgefleet-{__version__}.dist-info/entry_points.txt").decode()


def test_sdist_carries_the_sources_profiles_and_docs(dist: Dist) -> None:
    top = f"edgefleet-{__version__}"
    with tarfile.open(dist.sdist) as sdist:
        names = set(sdist.getnames())
    for path in ("pyproject.toml", "README.md", "PKG-INFO", "agent/__init__.py", "docs/agent.md"):
        assert f"{top}/{path}" in names
    assert {f"{top}/hardware_profiles/{p}" for p in PROFILES} <= names
    assert not [n for n in names if "__pycache__" in n or "/.venv/" in n]


def test_wheel_installs_into_a_clean_venv_and_runs(
    dist: Dist, wheelhouse: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # offline: edgefleet's dependencies come from the wheelhouse only
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin/python"),
            "install",
            "--no-index",
            "--find-links",
            str(wheelhouse),
            "--no-compile",
            "--quiet",
            str(dist.wheel),
        ],
        check=True,
        timeout=170,
    )
    check = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout

    def edgefleet(*args: str) -> str:
        # run outside the checkout, so nothing can be imported from it
        result = subprocess.run(
            [str(venv / "bin/edgefleet"), *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert edgefleet("--version").strip() == f"edgefleet, version {__version__}"
    report = json.loads(edgefleet("hardware", "--json"))
    assert sorted(f"{p['name']}.toml" for p in report["profiles"]) == PROFILES
    where = subprocess.run(
        [str(venv / "bin/python"), "-c", "import agent; print(agent.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(venv)
