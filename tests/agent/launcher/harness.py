"""The launcher as a real process in a temporary root, and agent releases built at test time.

Each release is a tree (``release.json`` and ``lib/``) whose entry module is written here:
``good`` runs the real agent of this checkout; ``crashing`` raises at import; ``never_ready``
runs the real agent with its notify socket taken away, so it serves but never says READY=1;
``exits_in_window`` says READY=1 and exits 1 half a second later; ``silent_after_ready`` says
READY=1 and then nothing (a hung agent: no watchdog pings).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent.launcher.journal import Journal, load_journal
from tests.agent.server import wait_until

REPO = Path(__file__).resolve().parents[3]

ENTRIES = {
    "good": "from common.cli import main\n\nmain()\n",
    "crashing": 'raise ImportError("no module named agent_core_v3 (a broken release)")\n',
    "never_ready": (
        'import os\n\nos.environ.pop("NOTIFY_SOCKET")\nfrom common.cli import main\n\nmain()\n'
    ),
    "exits_in_window": (
        "import os, socket, sys, time\n\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        's.sendto(b"READY=1", os.environ["NOTIFY_SOCKET"])\n'
        "time.sleep(0.5)\n"
        "sys.exit(1)\n"
    ),
    "silent_after_ready": (
        "import os, socket, time\n\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        's.sendto(b"READY=1", os.environ["NOTIFY_SOCKET"])\n'
        "time.sleep(3600)\n"
    ),
}


def build_release(directory: Path, version: str, kind: str) -> Path:
    """A release tree of ``kind`` (a key of :data:`ENTRIES`) in ``directory/version``."""
    tree = directory / f"{version}-{kind}"
    (tree / "lib").mkdir(parents=True)
    (tree / "lib" / "edgefleet_release.py").write_text(ENTRIES[kind])
    info = {"version": version, "entry": "edgefleet_release"}
    (tree / "release.json").write_text(json.dumps(info))
    return tree


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``edgefleet ARGS`` as a user types it, this checkout's code first on the path."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "common.cli", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )


@dataclass
class LauncherProcess:
    root: Path
    port: int
    settings: dict[str, str]
    extra_env: dict[str, str] = field(default_factory=dict)
    agent: list[str] | None = None
    """The agent's command line; by default an empty model repository on ``port``."""
    proc: subprocess.Popen[str] | None = None
    logs: list[dict[str, Any]] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def start(self) -> LauncherProcess:
        repo = self.root.parent / "models"
        repo.mkdir(exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(REPO), **self.extra_env}
        env.update({f"EDGEFLEET_LAUNCHER_{k.upper()}": v for k, v in self.settings.items()})
        agent = self.agent or ["agent", "--model-repository", str(repo), "--port", str(self.port)]
        command = [sys.executable, "-m", "common.cli", "launcher", "run"]
        self.proc = subprocess.Popen(
            [*command, "--root", str(self.root), "--", *agent],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = {"message": line.rstrip()}
            if isinstance(record, dict):
                self.logs.append(record)

    def journal(self) -> Journal:
        return load_journal(self.root / "launcher.json")

    def wait(self, predicate: Any, what: str, timeout_s: float = 60.0) -> Journal:
        """Wait until the journal satisfies ``predicate``; it, then."""
        assert self.proc is not None

        def holds() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"launcher exited {self.proc.returncode}: {self.logs[-5:]}")
            path = self.root / "launcher.json"
            if not path.is_file():
                return False
            journal = self.journal()
            # a journal a killed launcher left says nothing of this one
            return journal.launcher_pid == self.proc.pid and bool(predicate(journal))

        wait_until(holds, timeout_s=timeout_s, what=what)
        return self.journal()

    def wait_running(self, version: str) -> Journal:
        journal = self.wait(
            lambda j: j.current == version and j.phase == "running" and j.trial is None,
            what=f"{version} running",
        )
        assert self.agent_ready()
        return journal

    def agent_ready(self) -> bool:
        response = httpx.get(f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=10)
        return response.status_code == 200

    def messages(self, message: str) -> list[dict[str, Any]]:
        return [line for line in self.logs if line.get("message") == message]

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.join()

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=90)
        self.join()
        return code

    def join(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=10)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()


def port_free(port: int) -> bool:
    """Nobody listens on ``port`` (the agent of a launcher killed -9 died with it)."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0
