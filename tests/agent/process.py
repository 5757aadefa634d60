"""The agent as a real process (``edgefleet agent``), its JSON logs read as they come (from
stderr and stdout both; a line that is not JSON is kept in ``not_json``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.agent.server import wait_until


@dataclass
class AgentProcess:
    proc: subprocess.Popen[str]
    logs: list[dict[str, object]] = field(default_factory=list)
    address: str = ""
    not_json: list[str] = field(default_factory=list)

    def log_messages(self) -> list[object]:
        return [line.get("message") for line in self.logs]


@contextmanager
def agent_process(*args: str, env: dict[str, str] | None = None) -> Iterator[AgentProcess]:
    exe = Path(sys.executable).parent / "edgefleet"
    command = [str(exe), "agent", *args]
    environment = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment
    )
    handle = AgentProcess(proc)
    listening = threading.Event()

    def read_logs(stream: IO[str]) -> None:
        for line in stream:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                handle.not_json.append(line)
                record = {"message": line.rstrip()}
            if not isinstance(record, dict):
                handle.not_json.append(line)
                continue
            handle.logs.append(record)
            if record.get("message") == "agent listening":
                handle.address = str(record["address"])
                listening.set()

    assert proc.stderr is not None and proc.stdout is not None
    readers = [
        threading.Thread(target=read_logs, args=(stream,), daemon=True)
        for stream in (proc.stderr, proc.stdout)
    ]
    for reader in readers:
        reader.start()
    try:
        wait_until(
            lambda: listening.is_set() or proc.poll() is not None, what="the agent to listen"
        )
        if not listening.is_set():
            raise AssertionError(f"agent exited: {handle.logs}")
        yield handle
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for reader in readers:
            reader.join(timeout=10)
        proc.stderr.close()
        proc.stdout.close()
