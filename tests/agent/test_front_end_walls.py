"""No front end imports another: REST (``agent.api``), gRPC (``agent.grpc``) and the
OpenAI-compatible one (``agent.openai``) share only the cores (``agent.serving``,
``agent.generative``, which know no transport); REST and gRPC share only the
serving core (``agent.serving``), which knows no transport, and the HTTP server
(``agent.http``) knows no route. Read from the source, every import counted (those under
``TYPE_CHECKING`` and inside functions too), so a wall is not passed by a late import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WALLS = {
    "agent.serving": ("agent.api", "agent.grpc", "agent.http", "fastapi", "starlette", "grpc"),
    "agent.grpc": ("agent.api", "agent.http", "agent.openai"),
    "agent.api": ("agent.grpc", "agent.openai"),
    "agent.openai": ("agent.api", "agent.grpc"),
    "agent.generative": (
        "agent.api",
        "agent.grpc",
        "agent.openai",
        "agent.http",
        "fastapi",
        "starlette",
    ),
    "agent.http": ("agent.api", "agent.grpc", "agent.serving"),
}
"""Package -> what none of its modules may import."""


def imports(package: str) -> dict[str, set[str]]:
    """Every module of ``package`` -> the modules it imports (absolute names)."""
    found: dict[str, set[str]] = {}
    folder = ROOT / package.replace(".", "/")
    for path in folder.rglob("*.py"):
        if "proto" in path.relative_to(folder).parts:
            continue  # generated from the protos
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                assert node.level == 0, f"{module}: relative import"
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        found[module] = names
    return found


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("package", sorted(WALLS))
def test_a_front_end_imports_no_other(package: str) -> None:
    modules = imports(package)
    assert modules  # the package is where the test looks
    crossings = sorted(
        f"{module} -> {name}"
        for module, names in modules.items()
        for name in names
        for forbidden in WALLS[package]
        if within(name, forbidden)
    )
    assert not crossings, crossings
