"""A real Mosquitto on 127.0.0.1, on a free port, with its own config and persistence,
started and stopped (or killed) by the tests that need it."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Mosquitto:
    def __init__(self, workdir: Path, *, extra_config: str = "", port: int | None = None) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.extra_config = extra_config
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def config_text(self) -> str:
        # Started as root, mosquitto drops to the "mosquitto" user and then cannot write its
        # log or persistence file here: keep the user we are.
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name}\n" if os.geteuid() == 0 else ""
        return (
            user + f"listener {self.port} 127.0.0.1\n"
            f"persistence true\npersistence_location {self.workdir}/\n"
            "autosave_interval 1\nautosave_on_changes true\n"
            f"log_dest file {self.workdir}/mosquitto.log\nlog_type all\n"
            + (self.extra_config or "allow_anonymous true\n")
        )

    def start(self) -> Mosquitto:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        config = self.workdir / "mosquitto.conf"
        config.write_text(self.config_text())
        self.proc = subprocess.Popen(
            [exe, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 20
        while not _port_open(self.port):  # ready when the port accepts
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"mosquitto did not start: {(self.workdir / 'mosquitto.log').read_text()[-2000:]}"
                )
            time.sleep(0.02)
        self.starts += 1
        return self

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        self.proc.wait(timeout=20)
        self.proc = None

    def restart(self, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()

    def log(self) -> str:
        path = self.workdir / "mosquitto.log"
        return path.read_text() if path.exists() else ""
