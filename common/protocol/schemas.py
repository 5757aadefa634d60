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

from common.protocol.enrolment import EnrolmentAnswer, EnrolmentRequest
from common.protocol.messages import MESSAGE_TYPES
from common.protocol.signing import Envelope, TrustRoot

ALL: dict[str, type[BaseModel]] = {
    **MESSAGE_TYPES,
    "signed-envelope": Envelope,
    "trust-root": TrustRoot,
    "enrolment-request": EnrolmentRequest,
    "enrolment-answer": EnrolmentAnswer,
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
