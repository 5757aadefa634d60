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
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_paho(client: Any) -> None:
    """Disconnect a paho client run by ``loop_start`` and close every socket it holds.

    ``loop_stop`` leaves paho's wake-up socket pair (two TCP sockets on 127.0.0.1) open; left
    to the cyclic collector, its ResourceWarning is reported by whichever test runs next
    (CI saw one in an unrelated test). paho 2.x closes them only in ``_reset_sockets``, a
    private name: this call fails loudly with AttributeError if a paho release drops it."""
    client.disconnect()
    client.loop_stop()
    client._reset_sockets()


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


class WrittenMosquitto:
    """A real Mosquitto run from a mosquitto.conf the CLI wrote, unchanged: two listeners,
    the devices' (``port``) and the control plane's; its output in ``log_path``, a start
    ready when both ports accept."""

    def __init__(self, conf: Path, *, port: int, control_plane_port: int, log_path: Path) -> None:
        self.conf = conf
        self.port = port
        self.control_plane_port = control_plane_port
        self.log_path = log_path
        self.workdir = conf.parent
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The devices' listener."""
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def control_plane_url(self) -> str:
        return f"mqtt://127.0.0.1:{self.control_plane_port}"

    def start(self) -> WrittenMosquitto:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen([exe, "-c", str(self.conf)], stdout=out, stderr=out)
        deadline = time.monotonic() + 20
        while not (_port_open(self.port) and _port_open(self.control_plane_port)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mosquitto did not start: {self.log()[-2000:]}")
            time.sleep(0.02)
        return self

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        self.proc.wait(timeout=20)
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
