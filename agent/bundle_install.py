"""The device side of ``edgefleet bundle install``: hand a bundle to the agent's inbox
(:mod:`agent.fleet.bundles`) and read back what the agent made of it."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent.fleet.agent_release import AGENT_KEY
from agent.fleet.bundles import INBOX, RESULT_SUFFIX
from agent.fleet.settings import FleetSettings
from agent.fleet.state import StateFiles
from common.protocol.bundle import BundleReader

POLL_S = 0.2
"""How often the command looks for the agent's answer (a file: nothing to wait on)."""


def looks_like_a_bundle(bundle: Path) -> None:
    """Refuse at once a file that is no bundle (the agent verifies the rest).

    Raises:
        ProtocolError: ``malformed`` or ``oversize``, as the agent would say.
    """
    reader = BundleReader(bundle, max_desired_bytes=FleetSettings().max_message_bytes)
    try:
        reader.desired()
    finally:
        reader.close()


def hand_in(bundle: Path, state_dir: Path) -> Path:
    """Copy ``bundle`` into the inbox under a fresh name, whole before the agent sees it."""
    inbox = state_dir / INBOX
    inbox.mkdir(parents=True, exist_ok=True)
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    part = inbox / f"{name}.tar-partial"
    shutil.copyfile(bundle, part)
    return part.replace(inbox / f"{name}.tar")


def verdicts(handed: Path, wait_s: float) -> list[dict[str, Any]] | None:
    """The agent's result for the bundle, or None if it did not take it within ``wait_s``."""
    result = handed.with_name(handed.stem + RESULT_SUFFIX)
    deadline = time.monotonic() + wait_s
    while not result.is_file():
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)
    doc: list[dict[str, Any]] = json.loads(result.read_text())
    result.unlink()
    return doc


def _what(r: dict[str, Any]) -> str:
    version = f" v{r['version']}" if r.get("version") is not None else ""
    sequence = f" (sequence {r['sequence']})" if r.get("sequence") is not None else ""
    return f"{r.get('model') or 'bundle'}{version}{sequence}"


def outcome(
    results: list[dict[str, Any]], state_dir: Path, wait_s: float
) -> Iterator[tuple[str, bool]]:
    """A line per manifest and whether it went well: refused at once, or accepted and then
    committed or rolled back as the agent's state file records (within ``wait_s``)."""
    files = StateFiles(state_dir)
    deadline = time.monotonic() + wait_s
    for r in results:
        if not r["accepted"]:
            yield f"{_what(r)}: refused: {r['code']}: {r['reason']}", False
            continue
        if r["model"] == AGENT_KEY:  # the launcher's trial, not this agent's state file
            yield f"{_what(r)}: verified, handed to the launcher for its trial", True
            continue
        while True:
            ms = files.load_state().model(r["model"])
            if ms.committed_sequence == r["sequence"]:
                yield f"{_what(r)}: committed", True
                break
            if ms.failed_sequence == r["sequence"]:
                yield f"{_what(r)}: rolled back (its events say why)", False
                break
            if time.monotonic() >= deadline:
                yield f"{_what(r)}: verified, still on trial after {wait_s:g} s", True
                break
            time.sleep(POLL_S)
