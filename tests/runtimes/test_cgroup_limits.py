"""A container's limits, read from fake control group trees under the hardware seam's root:
cgroup v2 (with and without a namespace of its own), cgroup v1, and none."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimes.backends import open_model
from runtimes.base import Placement, Runtime
from runtimes.hardware.cgroup import CgroupLimits, read_limits
from runtimes.hardware.context import HardwareContext
from runtimes.hardware.probe import probe_machine
from runtimes.settings import RuntimeSettings
from tests.agent.server import copy_models, serve
from tests.runtimes.fake_machines import FakeMachine, inventory

GIB = 2**30


def _machine(files: dict[str, str], cpus: int = 16) -> FakeMachine:
    """A 16-core x86 host of 8 GiB, with ``files`` (path -> content) under its root."""
    return FakeMachine(
        "x86_64",
        cpus=cpus,
        files=tuple(files),
        extra=files,
        memory_kib=8 * 1024 * 1024,
    )


V2_CONTAINER = {  # a container with its own cgroup namespace: its group is the mount's top
    "/proc/self/cgroup": "0::/\n",
    "/sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory pids\n",
    "/sys/fs/cgroup/memory.max": f"{2 * GIB}\n",
    "/sys/fs/cgroup/cpu.max": "150000 100000\n",
}


def test_a_cgroup_v2_container_limit_caps_the_memory_budget_and_the_cpus(tmp_path: Path) -> None:
    root = _machine(V2_CONTAINER).build(tmp_path / "m")
    facts = probe_machine(root)
    assert (facts.memory_total_bytes, facts.memory_limit_bytes) == (8 * GIB, 2 * GIB)
    assert facts.usable_memory_bytes == 2 * GIB
    assert facts.cpu_quota == 1.5 and facts.usable_cpus == 2  # 1.5 CPUs keep two threads busy
    ctx = HardwareContext.detect(root=root, inventory=inventory())
    # generic-x86_64's fraction of what the container may use, not of the host's 8 GiB
    assert ctx.memory_budget_bytes == int(2 * GIB * ctx.profile.memory_budget_fraction)
    assert ctx.describe()["machine"]["memory_limit_bytes"] == 2 * GIB


def test_the_smallest_limit_on_the_way_up_a_v2_hierarchy_applies(tmp_path: Path) -> None:
    pod = "/kubepods.slice/kubepods-burstable.slice/pod1.slice"
    files = {
        "/proc/self/cgroup": f"0::{pod}/cri-containerd-abc.scope\n",
        "/sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
        f"/sys/fs/cgroup{pod}/memory.max": f"{GIB}\n",  # the pod's limit
        f"/sys/fs/cgroup{pod}/cpu.max": "max 100000\n",
        f"/sys/fs/cgroup{pod}/cri-containerd-abc.scope/memory.max": "max\n",
        f"/sys/fs/cgroup{pod}/cri-containerd-abc.scope/cpu.max": "200000 100000\n",
    }
    assert read_limits(_machine(files).build(tmp_path / "m")) == CgroupLimits(GIB, 2.0)


def test_a_cgroup_v1_container_without_its_own_namespace(tmp_path: Path) -> None:
    """/proc/self/cgroup names the host's path; the container's group is mounted at the top."""
    files = {
        "/proc/self/cgroup": "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": f"{512 * 2**20}\n",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000\n",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    }
    facts = probe_machine(_machine(files).build(tmp_path / "m"))
    assert (facts.memory_limit_bytes, facts.cpu_quota, facts.usable_cpus) == (512 * 2**20, 0.5, 1)


@pytest.mark.parametrize(
    "files",
    [
        {},  # no /proc/self/cgroup at all
        {  # cgroup v1 writes "no limit" as a huge number, and no quota as -1
            "/proc/self/cgroup": "4:memory:/\n3:cpu:/\n",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
            "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
            "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
        },
        {  # cgroup v2 without limits
            "/proc/self/cgroup": "0::/\n",
            "/sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
            "/sys/fs/cgroup/memory.max": "max\n",
            "/sys/fs/cgroup/cpu.max": "max 100000\n",
        },
    ],
    ids=["none", "v1-unlimited", "v2-unlimited"],
)
def test_no_limit_leaves_the_host_figures(tmp_path: Path, files: dict[str, str]) -> None:
    facts = probe_machine(_machine(files, cpus=4).build(tmp_path / "m"))
    assert (facts.memory_limit_bytes, facts.cpu_quota) == (None, None)
    assert (facts.usable_memory_bytes, facts.usable_cpus) == (8 * GIB, 4)


def test_the_real_root_counts_the_cpus_this_process_may_run_on() -> None:
    import os

    facts = probe_machine(Path("/"))
    assert facts.affinity_cpus == len(os.sched_getaffinity(0))
    assert 1 <= facts.usable_cpus <= facts.affinity_cpus


def test_an_agent_under_a_cpu_quota_sizes_its_runtimes_thread_pools_by_it(
    example_repo: Path, tmp_path: Path
) -> None:
    """A real agent on a fake 16-core host whose container may use 1.5 CPUs: one instance
    of ``mlp`` is given two intra-op threads (two instances one each), where ONNX Runtime would count the host's cores
    (the runtime factory seam records what each instance was given)."""
    given: list[int] = []

    def recording(model_file: Path, placement: Placement, settings: RuntimeSettings) -> Runtime:
        given.append(settings.intra_op_threads)
        return open_model(model_file, placement, settings)

    root = _machine(V2_CONTAINER).build(tmp_path / "host")
    repo = copy_models(example_repo, tmp_path / "repo", "mlp", configs={"mlp": "instances = 1\n"})
    with serve(repo, hardware_root=root, runtime_factory=recording) as agent:
        assert agent.infer_json("mlp", [[0.5] * 256]).status_code == 200
    assert given == [2]
    # the instance count left to the agent: one single-threaded instance per usable CPU
    given.clear()
    (repo / "mlp" / "config.toml").unlink()
    with serve(repo, hardware_root=root, runtime_factory=recording) as agent:
        assert agent.infer_json("mlp", [[0.5] * 256]).status_code == 200
    assert given == [1, 1]
