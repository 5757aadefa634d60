"""The password file's broker reload: a SIGHUP that arrives while the broker reloads is lost
(Mosquitto 2.0 reads the files when a reload begins and clears its flag when it ends), so a
device written during a long reload must be signalled for again after it, or it is refused
until the next change. Writes are coalesced to one per reload interval.

The broker here is a stand-in that reloads as Mosquitto's loop does, slowly (a real one's
reload is slow only with thousands of connected clients: benchmarks/fleet/enrolment.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.protocol.topics import Topics
from control_plane.enrolment.accounts import PasswordFileAccounts
from control_plane.provisioning.mosquitto import FleetAccess
from tests.mqtt_broker import free_port

RELOAD_S = 1.5
SLOW_BROKER = """
import os, signal, sys, time
from pathlib import Path
passwd, loaded, pid_file, reload_s = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], float(sys.argv[4])
flag = False
def hup(*_):
    global flag
    flag = True
signal.signal(signal.SIGHUP, hup)
Path(pid_file).write_text(str(os.getpid()))
while True:
    if flag:
        text = passwd.read_text()  # read as the reload begins
        time.sleep(reload_s)  # every connected client checked again
        flag = False  # cleared as it ends: a SIGHUP meanwhile is lost
        Path(str(loaded) + ".tmp").write_text(text)
        os.replace(str(loaded) + ".tmp", loaded)
    time.sleep(0.01)
"""


def users(loaded: Path) -> set[str]:
    if not loaded.is_file():
        return set()
    return {line.split(":", 1)[0] for line in loaded.read_text().splitlines() if line}


async def scenario(accounts: PasswordFileAccounts, loaded: Path) -> None:
    await accounts.issue("dev-a")  # written and signalled: a reload begins
    await asyncio.sleep(0.3)
    await accounts.issue("dev-b")  # written during that reload: its signal is lost
    deadline = time.monotonic() + 4 * RELOAD_S + 2
    while "dev-b" not in users(loaded):
        assert time.monotonic() < deadline, f"dev-b never loaded: {users(loaded)}"
        await asyncio.sleep(0.05)
    batches = accounts.batches.batches
    await asyncio.gather(*(accounts.issue(f"dev-{i}") for i in range(30)))
    assert accounts.batches.batches - batches <= 2  # one write for all (two if one was due)
    if accounts._trailing is not None:  # stop the trailing signals
        accounts._trailing.cancel()


@pytest.mark.slow
def test_a_device_written_during_a_reload_is_loaded_after_it(tmp_path: Path) -> None:
    state = tmp_path / "cp-state"
    out = tmp_path / "broker"
    FleetAccess(state).write_config(out, port=free_port(), bind="127.0.0.1")
    pid_file, loaded = out / "data" / "mosquitto.pid", tmp_path / "loaded"
    pid_file.unlink(missing_ok=True)
    args = [str(out / "passwd"), str(loaded), str(pid_file), str(RELOAD_S)]
    broker = subprocess.Popen([sys.executable, "-c", SLOW_BROKER, *args])
    try:
        deadline = time.monotonic() + 10
        while not pid_file.is_file():
            assert time.monotonic() < deadline and broker.poll() is None
            time.sleep(0.02)
        accounts = PasswordFileAccounts(state, Topics("edgefleet"), reload_interval_s=0.2)
        asyncio.run(scenario(accounts, loaded))
    finally:
        broker.terminate()
        broker.wait(timeout=10)
