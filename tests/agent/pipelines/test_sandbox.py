"""The process limit of a Python step's worker, measured with real processes: inside its
namespaces it counts the sandbox's processes only, not the other processes of the same user
(the agent's); without namespaces it is over what the user runs; and root, whom RLIMIT_NPROC
exempts, is bounded by the PID namespace's pid_max. And what the host offers in cgroups."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.pipelines import cgroups
from agent.pipelines.cgroups import CgroupSupport
from tests.agent.pipelines.test_python_steps import NAMESPACES

ROOT = Path(__file__).resolve().parents[3]
NOBODY = 65534

# Forks until refused (or 400 children), prints how many and kills them.
FORKS = """\
import json, os, sys, threading, time
from agent.pipelines import sandbox
if sys.argv[2] == "threaded":  # the kernel refuses a new user namespace to a threaded process
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
isolation = sandbox.enter(network=False, max_processes=int(sys.argv[1]))
kids = []
try:
    while len(kids) < 400:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except BlockingIOError:
    pass
print(json.dumps({"isolation": isolation, "forked": len(kids)}), flush=True)
for pid in kids:  # without namespaces nothing else would
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"""


def _readable_by_others(path: Path) -> bool:
    return all(p.stat().st_mode & 0o005 == 0o005 for p in (path, *path.parents))


def _unprivileged() -> tuple[str, int | None]:
    """An interpreter and a user to run as: this one as itself, or a Python that ``nobody``
    can run where the tests run as root (the venv's may be under /root)."""
    if os.geteuid() != 0:
        return sys.executable, None
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None or not _readable_by_others(ROOT / "agent"):
        pytest.skip("no Python that an unprivileged user can run on this checkout")
    return python, NOBODY


def _forks(python: str, user: int | None, limit: int, how: str = "plain") -> dict[str, object]:
    run = subprocess.run(
        [python, "-c", FORKS, str(limit), how],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        user=user,
        group=user,
        extra_groups=[] if user is not None else None,
    )
    assert run.returncode == 0, run.stderr
    result: dict[str, object] = json.loads(run.stdout)
    return result


@pytest.fixture
def same_user_elsewhere() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes of the sandbox's user outside any sandbox: more than its limit."""
    _, user = _unprivileged()
    procs = [subprocess.Popen(["sleep", "60"], user=user, group=user) for _ in range(24)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not NAMESPACES, reason="the host refuses user namespaces")
def test_the_limit_counts_the_sandboxs_processes_only(
    same_user_elsewhere: list[subprocess.Popen[bytes]],
) -> None:
    python, user = _unprivileged()
    result = _forks(python, user, limit=8)
    # the launcher, init and the worker are 3 of the 8; the user's 24 others do not count
    assert result == {"isolation": "namespaces", "forked": 8 - 3}
    assert all(proc.poll() is None for proc in same_user_elsewhere)
    result = _forks(python, user, limit=12)
    assert result == {"isolation": "namespaces", "forked": 12 - 3}


def test_without_namespaces_the_limit_is_over_what_the_user_runs(
    same_user_elsewhere: list[subprocess.Popen[bytes]],
) -> None:
    python, user = _unprivileged()
    result = _forks(python, user, limit=8, how="threaded")
    # counted with the user's other processes (the 24 here), as they were at the start
    assert result == {"isolation": "process-group", "forked": 8}
    assert all(proc.poll() is None for proc in same_user_elsewhere)


def _kernel_at_least(major: int, minor: int) -> bool:
    release = os.uname().release.split(".")
    return (int(release[0]), int(release[1].split("-")[0])) >= (major, minor)


@pytest.mark.skipif(not NAMESPACES, reason="the host refuses user namespaces")
@pytest.mark.skipif(os.geteuid() != 0, reason="root's case")
@pytest.mark.skipif(not _kernel_at_least(6, 14), reason="pid_max per PID namespace: 6.14+")
def test_root_is_bounded_by_the_pid_namespaces_pid_max() -> None:
    # RLIMIT_NPROC does not bind root: pid_max 301 leaves 300 tasks, init and worker included
    assert _forks(sys.executable, None, limit=8) == {"isolation": "namespaces", "forked": 298}


HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_cgroups_are_used_only_where_plainly_delegated() -> None:
    hybrid = cgroups.from_proc(HYBRID, "8:pids:/\n0::/\n")
    assert (hybrid.support, hybrid.parent) == (CgroupSupport.CGROUP_V1, None)
    assert "cgroup v1" in hybrid.reason
    service = "0::/system.slice/edgefleet-agent.service/agent\n"
    delegated = cgroups.from_proc(UNIFIED, service)
    assert delegated.support == CgroupSupport.DELEGATED
    assert delegated.parent == Path("/sys/fs/cgroup/system.slice/edgefleet-agent.service")
    session = cgroups.from_proc(UNIFIED, "0::/user.slice/user-1000.slice/session-2.scope\n")
    assert (session.support, session.parent) == (CgroupSupport.NOT_DELEGATED, None)
    assert cgroups.from_proc(UNIFIED, "0::/\n").support == CgroupSupport.NOT_DELEGATED
    assert cgroups.from_proc("", "0::/\n").support == CgroupSupport.NONE


def test_this_hosts_cgroups_are_read_and_named() -> None:
    found = cgroups.probe()
    v1 = any(
        " - cgroup " in line and {"pids", "memory"} & set(line.split()[-1].split(","))
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )
    assert (found.support == CgroupSupport.CGROUP_V1) == v1, found
    assert found.reason
    assert (found.parent is None) == (found.support != CgroupSupport.DELEGATED)
