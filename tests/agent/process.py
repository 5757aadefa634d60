"""The agent as a real process (``edgefleet agent``), its JSON logs read as they come."""

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

from tests.agent.server import wait_until


@dataclass
class AgentProcess:
    proc: subprocess.Popen[str]
    logs: list[dict[str, object]] = field(default_factory=list)
    address: str = ""

    def log_messages(self) -> list[object]:
        return [line.get("message") for line in self.logs]


@contextmanager
def agent_process(*args: str, env: dict[str, str] | None = None) -> Iterator[AgentProcess]:
    exe = Path(sys.executable).parent / "edgefleet"
    command = [str(exe), "agent", *args]
    environment = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=environment
    )
    handle = AgentProcess(proc)
    listening = threading.Event()

    def read_logs() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = {"message": line.rstrip()}
            handle.logs.append(record)
            if record.get("message") == "agent listening":
                handle.address = str(record["address"])
                listening.set()

    reader = threading.Thread(target=read_logs, daemon=True)
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
        reader.join(timeout=10)
        assert proc.stderr is not None
        proc.stderr.close()
