"""Each process imports only what it runs: the control plane loads no module of the agent, the
agent none of the control plane, and the shared kernel (``common``) neither. Checked in fresh
interpreters, since this test session has imported everything.

And the control plane has walls: its areas (``control_plane/<area>/`` and its top-level modules)
form no import cycle at run time, the arrows run routes -> areas -> db, and the ground floor
(db, settings, tokens, metrics, errors) imports no area. Checked on the source (every import,
a function's included, but not those under ``if TYPE_CHECKING:``)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from graphlib import CycleError, TopologicalSorter
from itertools import pairwise
from pathlib import Path

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
    "control_plane.app",
    "control_plane.registry.validation",
    "control_plane.k8s.lifespan",
    "control_plane.cli.fleet",
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


def imports_of(path: Path) -> set[str]:
    """The modules ``path`` imports at run time: anywhere in it, not under ``if TYPE_CHECKING:``
    (``from a import b`` counts ``a.b`` too, when that is a module)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                package = module_of(path).split(".")[: -node.level]
                base = ".".join(package + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names if is_module(f"{base}.{a.name}"))
    return names


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def area(module: str) -> str:
    """``control_plane.rollouts.engine`` -> ``rollouts``; a top-level module is its own area."""
    return module.split(".")[1]


def arrows_between_areas(package: str) -> dict[tuple[str, str], list[str]]:
    """Arrows between ``package``'s areas (its subpackages and top-level modules) at run time,
    each with the imports that draw it."""
    arrows: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in (ROOT / package).rglob("*.py"):
        module = module_of(path)
        if module == package:
            continue
        for name in imports_of(path):
            if name.startswith(package + ".") and area(name) != area(module):
                arrows[area(module), area(name)].append(f"{module} -> {name}")
    return arrows


def control_plane_arrows() -> dict[tuple[str, str], list[str]]:
    return arrows_between_areas("control_plane")


def import_cycle(arrows: dict[tuple[str, str], list[str]]) -> str | None:
    """One cycle of the arrows, with the imports that draw it; None if there is none."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in arrows:
        graph[a].add(b)
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        cycle = exc.args[1]
        via = [arrows[b, a][0] for a, b in pairwise(cycle)]  # b imports a
        return f"import cycle {' -> '.join(reversed(cycle))}: {'; '.join(reversed(via))}"
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    arrows = {
        ("a", "b"): ["x.a.m -> x.b"],
        ("b", "c"): ["x.b.m -> x.c"],
        ("c", "a"): ["x.c -> x.a"],
    }
    assert import_cycle(arrows) is not None
    assert import_cycle({("a", "b"): ["x.a -> x.b"]}) is None


@pytest.mark.parametrize("package", ["agent", "control_plane"])
def test_the_areas_of_a_package_form_no_import_cycle(package: str) -> None:
    """An area may import a lower one, never one that imports it back, even through others:
    the walls that let a maintainer change one area without reading the rest."""
    arrows = arrows_between_areas(package)
    assert len(arrows) > 10  # the imports were read
    cycle = import_cycle(arrows)
    assert cycle is None, cycle


GROUND_FLOOR = {"db": set(), "settings": set(), "errors": set(), "metrics": set(), "tokens": {"db"}}


@pytest.mark.parametrize("floor", sorted(GROUND_FLOOR))
def test_the_ground_floor_imports_no_area(floor: str) -> None:
    above = {b: via for (a, b), via in control_plane_arrows().items() if a == floor}
    assert set(above) <= GROUND_FLOOR[floor], above


def test_only_the_app_and_the_console_import_the_routes() -> None:
    importers = {a for a, b in control_plane_arrows() if b == "api"}
    assert importers <= {"app", "console", "main"}, importers


@pytest.mark.parametrize("package", ["enrolment", "deployments", "quality"])
def test_an_area_holds_no_fastapi(package: str) -> None:
    web = [
        f"{module_of(path)} -> {name}"
        for path in (ROOT / "control_plane" / package).rglob("*.py")
        for name in imports_of(path)
        if name.split(".")[0] in ("fastapi", "starlette")
    ]
    assert not web


def test_the_operator_commands_live_in_one_wing() -> None:
    """click is imported in control_plane/cli/ only: an area's logic is not a command's."""
    outside = [
        module_of(path)
        for path in (ROOT / "control_plane").rglob("*.py")
        if "cli" not in path.relative_to(ROOT / "control_plane").parts[:1]
        and any(name.split(".")[0] == "click" for name in imports_of(path))
    ]
    assert (ROOT / "control_plane" / "cli" / "rollouts.py").is_file()  # the wing is there
    assert not outside, outside


def test_pipelines_and_metrics_load_no_module_of_the_inference_service() -> None:
    # the arrows run one way: agent.inference builds on agent.pipelines and feeds agent.metrics
    loaded = loaded_packages("agent.pipelines.pipeline", "agent.pipelines.version", "agent.metrics")
    assert "agent.pipelines.version" in loaded
    assert not of_package(loaded, "agent.inference"), of_package(loaded, "agent.inference")


MAX_FUNCTION_LINES = 80
"""A function a reader holds in one screen, from its ``def`` line to its last (decorators not
counted); a longer one is usually a state machine or a list of steps that wants names."""
AGENT_CORE = ("agent/inference", "agent/fleet", "agent/generative", "agent/openai")


def long_functions(root: Path, folders: tuple[str, ...]) -> list[str]:
    """``path:line name (N lines)`` of every function or method over the limit."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    assert node.end_lineno is not None
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        where = path.relative_to(root)
                        found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_long_functions_in_the_agent_core() -> None:
    assert long_functions(ROOT, AGENT_CORE) == []


def test_the_long_function_check_names_what_is_too_long(tmp_path: Path) -> None:
    body = "".join(f"    x{n} = {n}\n" for n in range(MAX_FUNCTION_LINES))  # + the def line
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "m.py").write_text(
        f"@staticmethod\ndef long():\n{body}\n\ndef fits():\n{body[: body.rindex('    x')]}"
    )
    assert long_functions(tmp_path, ("core",)) == [
        f"core/m.py:2 long ({MAX_FUNCTION_LINES + 1} lines)"
    ]


CROSS_CUTTING = {"access", "faults", "hardening"}
"""Suites about the whole system rather than one package: broker ACL and access from both
sides, faults of every kind, hostile input (tests/README.md)."""


def test_the_tests_mirror_the_packages() -> None:
    """tests/<package>/<area>/ for each package and area there is; the cross-cutting suites
    aside, a folder of tests names what it tests."""
    folders = {p.name for p in (ROOT / "tests").iterdir() if (p / "__init__.py").is_file()}
    assert {"agent", "control_plane", "benchmarks"} <= folders
    assert folders - CROSS_CUTTING <= {p.name for p in ROOT.iterdir() if p.is_dir()}
    for package in ("agent", "control_plane"):
        areas = {p.name for p in (ROOT / package).iterdir() if p.is_dir()}
        tested = {p.name for p in (ROOT / "tests" / package).iterdir() if p.is_dir()}
        assert tested - {"__pycache__"} <= areas, (package, tested - areas)
