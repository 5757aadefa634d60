"""What a consistent on-disk model store looks like after a crash (agent/fleet/store.py)."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

from agent.fleet.state import FleetState
from agent.fleet.store import DIGESTS_FILE
from runtimes.formats import find_model_file


def check_store(repo: Path, state_dir: Path, model: str) -> int:
    """Assert the store of ``model`` is consistent; return the version its pointer names.

    - ``config.toml`` parses and names exactly one version (or none: the newest), which is on
      disk with a model file;
    - every version directory the fleet installed is complete (its files match its digests):
      a half-copied version never appears under the model, only in ``.staging``;
    - ``fleet-state.json`` parses and agrees with the pointer.
    """
    policy = tomllib.loads((repo / model / "config.toml").read_text()).get("version_policy")
    if policy is None:  # never updated by the fleet: the default policy, the newest version
        pointer = max(int(p.name) for p in (repo / model).iterdir() if p.name.isdigit())
    else:
        assert len(policy["specific"]) == 1, policy
        pointer = int(policy["specific"][0])
    find_model_file(repo / model / str(pointer))  # raises if the committed one has no model
    for version_dir in (repo / model).iterdir():
        digests_file = version_dir / DIGESTS_FILE
        if version_dir.is_dir() and digests_file.is_file():
            for name, sha in json.loads(digests_file.read_text()).items():
                actual = hashlib.sha256((version_dir / name).read_bytes()).hexdigest()
                assert actual == sha, f"{version_dir / name} is not the verified file"
    state_file = state_dir / "fleet-state.json"
    state = (
        FleetState.model_validate_json(state_file.read_bytes())
        if state_file.exists()
        else FleetState()
    )
    committed = state.model(model).committed_version
    assert committed in (None, pointer), f"fleet state says {committed}, the pointer {pointer}"
    return pointer
