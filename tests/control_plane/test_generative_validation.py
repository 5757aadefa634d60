"""Validation of a generative folder, called directly on real folders (no server): the reference
prompts and outputs a folder brings are what greedy decoding must produce, and each fault names
where it is."""

from __future__ import annotations

import json
from pathlib import Path

from control_plane.registry.generative import validate_generative
from runtimes.examples.tiny_lm import write_tiny_lm
from runtimes.generative_check import GenaiFolder, greedy_onnxruntime


def checks_of(folder: Path) -> dict[str, tuple[bool, str]]:
    found: dict[str, tuple[bool, str]] = {}
    validate_generative(folder, "v", lambda name, ok, detail: found.update({name: (ok, detail)}))
    return found


def test_the_folders_reference_outputs_are_checked(tmp_path: Path) -> None:
    write_tiny_lm(tmp_path)
    folder = GenaiFolder.read(tmp_path)
    prompts = ["status report", "the edge"]
    expected = greedy_onnxruntime(folder, folder.encode(prompts), 5)
    reference = {"prompts": prompts, "max_tokens": 5, "outputs": expected}
    (tmp_path / "reference_prompts.json").write_text(json.dumps(reference))
    ok, detail = checks_of(tmp_path)["v on onnxruntime gives the folder's reference outputs"]
    assert ok and detail == "token for token over 10 tokens", detail
    reference["outputs"] = [expected[0], [*expected[1][:2], 7, 7, 7]]
    (tmp_path / "reference_prompts.json").write_text(json.dumps(reference))
    ok, detail = checks_of(tmp_path)["v on onnxruntime gives the folder's reference outputs"]
    assert not ok and detail.startswith("prompt 1: token 2 differs"), detail


def test_an_unusable_reference_file_or_config_is_named(tmp_path: Path) -> None:
    write_tiny_lm(tmp_path)
    (tmp_path / "reference_prompts.json").write_text('{"max_tokens": 3}')
    ok, detail = checks_of(tmp_path)["v is a readable generative folder"]
    assert not ok and "reference_prompts.json is not usable" in detail
    (tmp_path / "reference_prompts.json").unlink()
    (tmp_path / "genai_config.json").write_text('{"model": {}}')
    ok, detail = checks_of(tmp_path)["v is a readable generative folder"]
    assert not ok and "genai_config.json is not a usable config" in detail
