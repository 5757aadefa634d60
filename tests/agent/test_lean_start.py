"""What ``edgefleet agent`` imports before it serves: not the control plane's commands, not
httpx (only a payload log's HTTP sink and the fleet client use it): each cost the start-up time
docs/benchmarks.md measures. And the shortcut that loads only the invoked part keeps every
command of a shared group (``models``) and of the root's help."""

from __future__ import annotations

import json
import subprocess
import sys

LOADED = """
import json, sys
from common.cli import root
cli = root({invoked!r})
{then}
print(json.dumps({{"modules": sorted(sys.modules), "commands": sorted(cli.commands),
    "models": sorted(getattr(cli.commands.get("models"), "commands", {{}}))}}))
"""


def loaded(invoked: str | None, then: str = "") -> dict[str, list[str]]:
    code = LOADED.format(invoked=invoked, then=then)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_the_agent_command_imports_neither_the_control_plane_nor_httpx() -> None:
    doc = loaded("agent", then="import agent.main")
    # the launcher and the device's `bundle install` come with the agent's part
    assert doc["commands"] == ["agent", "bundle", "launcher"]
    heavy = [m for m in doc["modules"] if m.split(".")[0] in ("control_plane", "httpx", "rich")]
    assert heavy == [], heavy


def test_a_shared_group_and_the_root_keep_every_part_s_commands() -> None:
    everything = loaded(None)
    assert {"agent", "hardware", "models", "rollouts", "demo"} <= set(everything["commands"])
    models = loaded("models")
    assert models["commands"] == everything["commands"]
    # the agent's `example` and the control plane's `push` side by side
    assert {"example", "push"} <= set(models["models"]), models["models"]
    assert loaded("rollouts")["commands"] == everything["commands"]  # a part's, not its name
