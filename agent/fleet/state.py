"""What the fleet client must remember across restarts, written atomically.

``fleet-state.json`` holds, per model, the committed version and manifest sequence (the
anti-rollback floor), the version before it (for a local rollback), and the last sequence
that failed (so a retained desired state does not retry a rolled-back update forever).
``trust-root.json`` holds the current trust root.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from common.files import write_atomically
from common.protocol.signing import TrustRoot


class ModelState(BaseModel):
    committed_version: int | None = None
    committed_sequence: int | None = None
    previous_version: int | None = None
    previous_sequence: int | None = None
    """The sequence ``previous_version`` was committed with."""
    failed_sequence: int | None = None
    restored_sequence: int | None = None
    """After the fleet's rollback command: the sequence of the version switched back to. The
    control plane then lists that older manifest again as the desired state; it is what runs,
    not a replay (the floor stays at ``committed_sequence``, so the rolled-back one is not
    taken again)."""

    def applied(self, sequence: int | None) -> bool:
        """Whether a manifest of ``sequence`` is what this device runs or refused already."""
        return sequence is not None and sequence in (
            self.committed_sequence,
            self.failed_sequence,
            self.restored_sequence,
        )

    def floor(self) -> int | None:
        """Manifests must be newer than this sequence."""
        seqs = [s for s in (self.committed_sequence, self.failed_sequence) if s is not None]
        return max(seqs) if seqs else None


class FleetState(BaseModel):
    models: dict[str, ModelState] = Field(default_factory=dict)
    executed_commands: list[str] = Field(default_factory=list)
    """Recent command ids, so a redelivered command is not executed twice."""

    def model(self, name: str) -> ModelState:
        return self.models.setdefault(name, ModelState())


class StateFiles:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.state_path = state_dir / "fleet-state.json"
        self.trust_path = state_dir / "trust-root.json"

    def load_state(self) -> FleetState:
        if not self.state_path.is_file():
            return FleetState()
        return FleetState.model_validate_json(self.state_path.read_bytes())

    def save_state(self, state: FleetState) -> None:
        write_atomically(self.state_path, state.model_dump_json(indent=2).encode())

    def load_trust(self, provisioned: Path | None) -> TrustRoot:
        """The stored trust root, else the provisioned one.

        Raises:
            FileNotFoundError: neither exists.
        """
        source = self.trust_path if self.trust_path.is_file() else provisioned
        if source is None or not source.is_file():
            raise FileNotFoundError(
                f"no trust root in {self.trust_path} and none provisioned (fleet.trust_root_file)"
            )
        doc: Any = json.loads(source.read_bytes())
        if isinstance(doc, dict) and "signed" in doc:  # a signed envelope: the root is inside
            doc = doc["signed"]
        return TrustRoot.model_validate(doc)

    def save_trust(self, trust: TrustRoot) -> None:
        write_atomically(self.trust_path, trust.model_dump_json(indent=2).encode())
