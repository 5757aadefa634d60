"""The walls around a Python step's worker, raised by the worker itself before the user's file
is imported (:func:`enter`).

Where the kernel lets an unprivileged process make namespaces (user, PID and, unless the step
asks for the network, network), the worker runs as PID 2 of a PID namespace of its own, under
a small init (PID 1) that only waits for it:

    agent -> launcher (the process the agent started) -> init (PID 1) -> worker (PID 2)

Killing the launcher kills init (``PR_SET_PDEATHSIG``), and the kernel kills every process of
a PID namespace when its init dies: whatever the user's code forked, even a child that called
``setsid()``, goes with it. Without namespaces (a container whose seccomp profile refuses
``unshare``, a kernel with ``user.max_user_namespaces = 0``), the worker is still the leader
of a session and process group of its own (the agent starts it so) and the agent kills the
group; a descendant that leaves the group outlives it there. docs/pipelines.md says what is
isolated in each case.

The number of processes (threads count too) is bounded inside the namespaces only: RLIMIT_NPROC
set after ``unshare`` counts the processes of the worker's user *in its own user namespace*
(the kernel's ucounts, 5.14+), not the agent's; the kernel exempts root from it, so an agent
run as root relies on the PID namespace's own ``pid_max`` instead (kernels 6.14+; at least 300
tasks). Without namespaces RLIMIT_NPROC counts every process of the agent's user: it is set
there to what that user runs at the worker's start plus the limit, an approximate bound that
the agent's own new threads eat into (a delegated cgroup, :mod:`agent.pipelines.cgroups`, is
exact).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import resource
import signal
import sys
from enum import StrEnum

CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PID_MAX_MIN = 301
"""The kernel's least ``pid_max`` (RESERVED_PIDS + 1)."""


class Isolation(StrEnum):
    NAMESPACES = "namespaces"
    """User and PID namespaces (and a network namespace with no interface up)."""
    PROCESS_GROUP = "process-group"
    """A session and process group of its own: killed as a group."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _unshare(network: bool) -> bool:
    """New user and PID namespaces (and a network one unless ``network``); False where the
    kernel refuses."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWPID | (0 if network else CLONE_NEWNET)
    if _libc().unshare(flags) != 0:
        if ctypes.get_errno() in (errno.EPERM, errno.EINVAL, errno.ENOSPC, errno.EUSERS):
            return False
        raise OSError(ctypes.get_errno(), "unshare")
    # the same user inside as outside: files the worker makes belong to the agent's user
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    return True


def _die_with_parent() -> None:
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _let_go_of_the_pipes() -> None:
    """Close this process's stdin and stdout (the worker's frames): a worker that dies must
    leave the agent reading end-of-file, not a pipe its launcher still holds open."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)


def _wait_and_mirror(pid: int) -> None:
    """The launcher: wait for init and end as the worker did (init passes a signal on as
    ``128 + signal``): the same exit status or the same signal, so the agent reads the worker's
    death (``killed by SIGXCPU``) from its own child."""
    _let_go_of_the_pipes()
    _, status = os.waitpid(pid, 0)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    if 128 < code < 128 + signal.NSIG:
        signal.signal(code - 128, signal.SIG_DFL)
        os.kill(os.getpid(), code - 128)
    os._exit(code)


def _init(worker: int) -> None:
    """PID 1 of the namespace: reap whatever is orphaned to it until the worker ends, then end
    as it did (which ends the namespace and every process left in it)."""
    _let_go_of_the_pipes()
    while True:
        pid, status = os.wait()
        if pid == worker:
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.WEXITSTATUS(status))


def _join(cgroup: str) -> None:
    """Move this process (and so all it will start) into its cgroup, before the namespaces:
    the agent's user owns the delegated tree outside, not inside them."""
    _write(os.path.join(cgroup, "cgroup.procs"), "0")


def _pid_max_per_namespace() -> bool:
    """Linux 6.14+ keeps a ``pid_max`` per PID namespace."""
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if found is None:
        return False
    major, minor = int(found[1]), int(found[2])
    return (major, minor) >= (6, 14)


def _bound_the_namespace(max_processes: int) -> None:
    """PID 1's, for root only (RLIMIT_NPROC binds everyone else): cap the PID namespace's own
    ``pid_max``. Never on an older kernel: there ``pid_max`` is the host's, and root mapped to
    itself in a user namespace still passes the sysctl's permission check."""
    if os.geteuid() != 0 or not _pid_max_per_namespace():
        return
    try:
        _write("/proc/sys/kernel/pid_max", str(max(max_processes + 1, PID_MAX_MIN)))
    except OSError:
        pass


def _limit_processes(count: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    limit = count if hard == resource.RLIM_INFINITY else min(count, hard)
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))


def _tasks_of(uid: int) -> int:
    """Processes and threads of ``uid`` now, as RLIMIT_NPROC counts them outside namespaces."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue  # gone meanwhile
        if int(status.get("Uid", "-1 ").split()[0]) == uid:
            count += int(status.get("Threads", "1"))
    return count


def _bound_the_user(max_processes: int) -> None:
    """Without namespaces: RLIMIT_NPROC over what the user runs now (root is exempt)."""
    if os.geteuid() != 0:
        _limit_processes(_tasks_of(os.getuid()) + max_processes)


def enter(network: bool, max_processes: int, cgroup: str | None = None) -> Isolation:
    """Raise the walls; returns in the worker proper (the other processes of the chain never
    return from here). ``max_processes`` counts this process, the init and the worker too."""
    if cgroup:
        _join(cgroup)
    if sys.platform != "linux":
        return Isolation.PROCESS_GROUP
    if not _unshare(network):
        _bound_the_user(max_processes)
        return Isolation.PROCESS_GROUP
    # set now, in the new user namespace: counted there only, and inherited by init and worker
    _limit_processes(max_processes)
    init = os.fork()  # the first child of the launcher is PID 1 of the new namespace
    if init:
        _wait_and_mirror(init)
    _die_with_parent()
    _bound_the_namespace(max_processes)
    worker = os.fork()
    if worker:
        _init(worker)
    _die_with_parent()
    return Isolation.NAMESPACES
