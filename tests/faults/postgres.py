"""A private PostgreSQL 15 on 127.0.0.1 on a free port, in a temporary directory, that the
tests may restart (fast or immediate) without touching the shared instance on 5432.

PostgreSQL refuses to run as root: when the tests run as root, the server runs as the
``postgres`` user through ``runuser``."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

import psycopg

from tests.agent.server import wait_until
from tests.mqtt_broker import free_port

BIN = Path("/usr/lib/postgresql/15/bin")
ShutdownMode = Literal["smart", "fast", "immediate"]


def available() -> str | None:
    """None if a private server can run here, else why not."""
    if not (BIN / "pg_ctl").is_file():
        return f"no PostgreSQL 15 binaries in {BIN}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
        if shutil.which("runuser") is None:
            return "running as root and runuser is missing"
    return None


class PostgresServer:
    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="edgefleet-pg-"))
        self.data = self.workdir / "data"
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.workdir, entry.pw_uid, entry.pw_gid)
        self.starts = 0

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return subprocess.run(
            [*prefix, *args], capture_output=True, text=True, timeout=120, check=True
        )

    @property
    def admin_url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def init(self) -> PostgresServer:
        self._run(
            str(BIN / "initdb"),
            "-D",
            str(self.data),
            "--auth=trust",
            "-U",
            self.user,
            "--no-sync",
            "-E",
            "UTF8",
        )
        return self

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.workdir} "
            "-c fsync=off -c max_connections=100"
        )
        self._run(
            str(BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.workdir / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        wait_until(self.accepting, timeout_s=60, what="PostgreSQL to accept connections")
        self.starts += 1

    def stop(self, mode: ShutdownMode = "fast") -> None:
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def accepting(self) -> bool:
        try:
            with psycopg.connect(self.admin_url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log(self) -> str:
        path = self.workdir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def destroy(self) -> None:
        """Stop (immediate) if running and remove the data directory."""
        if (self.data / "postmaster.pid").exists():
            try:
                self.stop("immediate")
            except subprocess.CalledProcessError:
                pass
        shutil.rmtree(self.workdir, ignore_errors=True)
