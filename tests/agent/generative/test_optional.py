"""Generative serving is optional: an agent whose repository holds no generative model loads
none of its code nor its extra's packages (checked in a fresh interpreter)."""

from __future__ import annotations

from tests.test_layout import loaded_packages


def test_an_agent_without_generative_models_loads_no_token_loop() -> None:
    loaded = loaded_packages("agent.main", "agent.cli", "agent.api.app")
    assert "agent.main" in loaded
    heavy = {"tokenizers", "jinja2", "onnxruntime_genai", "agent.generative.engine", "agent.openai"}
    assert not heavy & loaded, heavy & loaded
