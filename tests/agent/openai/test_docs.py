"""docs/generative.md runs: its settings block is valid agent settings, and its Python block,
as it is, gets an answer from a real agent (only the address changed to the test's)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from agent.settings import AgentSettings
from tests.agent.server import RunningAgent

PAGE = Path(__file__).resolve().parents[3] / "docs" / "generative.md"


def block(language: str) -> str:
    (found,) = re.findall(rf"^```{language}\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    return str(found)


def test_the_settings_block_is_valid_agent_settings(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(block("toml"))
    settings = AgentSettings(model_repository=tmp_path, **tomllib.loads(config.read_text()))
    assert settings.generative.kv_cache_tokens == 4096 and settings.generative.max_sequences == 16


def test_the_python_block_answers(agent: RunningAgent) -> None:
    code = block("python").replace("http://localhost:8000", agent.url)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() and run.stdout.strip().isprintable()
