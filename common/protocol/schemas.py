"""JSON Schemas of the wire messages, exported to ``docs/schemas/``.

python -m common.protocol.schemas docs/schemas    # write
python -m common.protocol.schemas --check docs/schemas
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from common.protocol.agent_release import AgentReleaseManifest
from common.protocol.capture import CaptureAck, CaptureUpload
from common.protocol.diagnostics import DiagnosticAck, DiagnosticUpload
from common.protocol.enrolment import EnrolmentAnswer, EnrolmentRequest
from common.protocol.ground_truth import GroundTruthReport
from common.protocol.messages import MESSAGE_TYPES
from common.protocol.signing import Envelope, TrustRoot
from common.protocol.twin import ConfigTwin

ALL: dict[str, type[BaseModel]] = {
    **MESSAGE_TYPES,
    "agent-release-manifest": AgentReleaseManifest,
    "signed-envelope": Envelope,
    "trust-root": TrustRoot,
    "config-twin": ConfigTwin,
    "enrolment-request": EnrolmentRequest,
    "enrolment-answer": EnrolmentAnswer,
    "ground-truth-report": GroundTruthReport,
    "capture-upload": CaptureUpload,
    "capture-ack": CaptureAck,
    "diagnostic-upload": DiagnosticUpload,
    "diagnostic-ack": DiagnosticAck,
}


def schemas() -> dict[str, dict[str, Any]]:
    out = {}
    for name, model in ALL.items():
        schema = model.model_json_schema()
        schema["$id"] = f"https://edgefleet.dev/schemas/{name}.json"
        out[f"{name}.json"] = schema
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def drift(directory: Path) -> list[str]:
    """Files in ``directory`` that differ from the code's schemas (or are missing/extra)."""
    expected = schemas()
    found = {p.name for p in directory.glob("*.json")} if directory.is_dir() else set()
    problems = [f"{name}: missing" for name in sorted(set(expected) - found)]
    problems += [f"{name}: not a message of the protocol" for name in sorted(found - set(expected))]
    for name in sorted(set(expected) & found):
        if (directory / name).read_text() != render(expected[name]):
            problems.append(f"{name}: differs from the code")
    return problems


def main() -> None:
    args = sys.argv[1:]
    check = "--check" in args
    directory = Path(next((a for a in args if not a.startswith("--")), "docs/schemas"))
    if check:
        problems = drift(directory)
        print("\n".join(problems) or "schemas match")
        sys.exit(1 if problems else 0)
    directory.mkdir(parents=True, exist_ok=True)
    for name, schema in schemas().items():
        (directory / name).write_text(render(schema))
    print(f"wrote {len(ALL)} schemas to {directory}")


if __name__ == "__main__":
    main()
