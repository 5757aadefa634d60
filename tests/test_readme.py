"""The README's two commands stay true: CI runs the test one verbatim."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line.strip() for line in lines if line.startswith("    python3 -m venv")]


def test_readme_has_a_demo_command_and_a_test_command() -> None:
    demo, test = _commands()[:2]
    assert demo.endswith("edgefleet demo")
    assert test.endswith("python -m pytest")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    test = _commands()[1]
    assert test in (ROOT / ".ci/run").read_text().splitlines()
