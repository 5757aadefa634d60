"""The Debian package: built by packaging/deb/build-deb.sh with dpkg-deb (the real thing: the
full virtual environment), its control fields, files, conffiles and maintainer scripts checked,
unpacked with ``dpkg -x`` and run from there, and installed, reconfigured, removed and purged
with ``dpkg --root`` in a scratch root (maintainer scripts run chrootless, on that root's user
database and unit links)."""

from __future__ import annotations

import marshal
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.settings import load_settings
from common import __version__
from tests.agent.server import copy_models
from tests.agent.test_systemd import receive_until
from tests.packaging.conftest import ROOT, Dist

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian tools)"),
]

SCRIPTS = ("postinst", "prerm", "postrm")
UNIT = "usr/lib/systemd/system/edgefleet-agent.service"
VENV = "opt/edgefleet/venv"


@dataclass(frozen=True)
class Package:
    deb: Path
    control: Path
    """The control archive, unpacked (``dpkg-deb -e``)."""
    files: Path
    """The data archive, unpacked (``dpkg -x``)."""


def _run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=170, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def package(dist: Dist, wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Package:
    out = tmp_path_factory.mktemp("deb")
    # zstd at level 1: the default (xz -6) takes minutes on two CPUs; the contents are the same
    build = _run(
        str(ROOT / "packaging/deb/build-deb.sh"),
        "--wheel",
        str(dist.wheel),
        "--out",
        str(out),
        "--pip",
        f"{sys.executable} -m pip",
        "--compression",
        "zstd",
        "--level",
        "1",
        "--",
        "--no-index",
        "--find-links",
        str(wheelhouse),
    )
    assert build.returncode == 0, build.stderr
    deb = Path(build.stdout.strip().splitlines()[-1])
    control, files = out / "control", out / "files"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(control)], check=True)
    subprocess.run(["dpkg", "-x", str(deb), str(files)], check=True)
    return Package(deb, control, files)


def python_minor() -> str:
    return _run(
        "/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"
    ).stdout.strip()


def test_control_fields(package: Package) -> None:
    def field(name: str) -> str:
        return _run("dpkg-deb", "-f", str(package.deb), name).stdout.strip()

    assert field("Package") == "edgefleet-agent"
    assert field("Version") == f"{__version__}-1"
    assert field("Architecture") == _run("dpkg", "--print-architecture").stdout.strip()
    assert field("Depends") == f"python{python_minor()}, passwd"
    # Installed-Size is the unpacked size in KiB: the venv alone is well over 100 MiB
    installed = sum(
        f.stat().st_size for f in package.files.rglob("*") if f.is_file() and not f.is_symlink()
    )
    assert abs(int(field("Installed-Size")) - installed / 1024) < 0.1 * installed / 1024
    assert package.deb.name == f"edgefleet-agent_{__version__}-1_{field('Architecture')}.deb"


def test_file_list_owners_and_modes(package: Package) -> None:
    listing = _run("dpkg-deb", "-c", str(package.deb)).stdout.splitlines()
    entries = {}
    for line in listing:
        mode, owner, _size, _date, _time, rest = line.split(maxsplit=5)
        path, _, target = rest.partition(" -> ")
        entries[path.removeprefix("./")] = (mode, owner, target)
    assert {owner for _, owner, _ in entries.values()} == {"root/root"}
    writable = [p for p, (mode, _, _) in entries.items() if mode[8] == "w" and mode[0] != "l"]
    assert not writable  # nothing world-writable (symbolic links show lrwxrwxrwx)
    assert entries[UNIT][0] == "-rw-r--r--"
    assert entries["etc/edgefleet/agent.toml"][0] == "-rw-r--r--"
    assert entries[f"{VENV}/bin/edgefleet"][0] == "-rwxr-xr-x"
    assert entries["usr/bin/edgefleet"][2] == "/opt/edgefleet/venv/bin/edgefleet"
    assert "usr/share/doc/edgefleet-agent/copyright" in entries
    site = f"{VENV}/lib/python{python_minor()}/site-packages"
    profiles = sorted(p.name for p in (ROOT / "hardware_profiles").glob("*.toml"))
    assert profiles and all(f"{site}/runtimes/hardware/profiles/{p}" in entries for p in profiles)
    for dependency in (
        "onnxruntime/__init__.py",
        "ai_edge_litert/__init__.py",
        "numpy/__init__.py",
    ):
        assert f"{site}/{dependency}" in entries
    assert not [p for p in entries if p.startswith(f"{VENV}/bin/pip")]  # no pip inside
    assert f"{site}/common/cli.py" in entries
    assert not [p for p in entries if p.startswith(f"{site}/benchmarks/") or "/bench/" in p]


def test_conffiles_and_default_config(package: Package) -> None:
    assert (package.control / "conffiles").read_text() == "/etc/edgefleet/agent.toml\n"
    settings = load_settings(package.files / "etc/edgefleet/agent.toml")
    assert settings.model_repository == Path("/var/lib/edgefleet/models")
    assert settings.runtime.cache_dir == Path("/var/cache/edgefleet")
    assert settings.host == "127.0.0.1" and not settings.fleet.enabled
    # the unit's writable paths are where the config points
    unit = (package.files / UNIT).read_text()
    assert "ReadWritePaths=/var/lib/edgefleet /var/cache/edgefleet" in unit
    assert (
        "ExecStart=/opt/edgefleet/venv/bin/edgefleet launcher run -- "
        "agent --config /etc/edgefleet/agent.toml" in unit
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_maintainer_scripts_are_strict_posix_shell(package: Package, script: str) -> None:
    path = package.control / script
    assert path.stat().st_mode & 0o777 == 0o755
    lines = path.read_text().splitlines()
    assert lines[0] == "#!/bin/sh" and "set -e" in lines
    syntax = _run("sh", "-n", str(path))
    assert syntax.returncode == 0, syntax.stderr


def test_unpacked_venv_runs_from_a_scratch_directory(package: Package, tmp_path: Path) -> None:
    venv = package.files / VENV
    # Scripts name their final path; the venv itself is relocatable through its interpreter
    # (python -> /usr/bin/python3, pyvenv.cfg next to it), so it runs from the scratch copy.
    assert (venv / "bin/edgefleet").read_text().splitlines()[
        0
    ] == "#!/opt/edgefleet/venv/bin/python"
    assert os.readlink(venv / "bin/python3") == "/usr/bin/python3"
    result = _run(str(venv / "bin/python"), str(venv / "bin/edgefleet"), "--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"edgefleet, version {__version__}"
    # no trace of the staging directory: scripts, pyvenv.cfg, byte code
    staged = re.compile(r"/edgefleet-deb\.[A-Za-z0-9]{6}/")
    for path in [*(venv / "bin").iterdir(), venv / "pyvenv.cfg"]:
        if path.is_file() and not path.is_symlink():
            assert not staged.search(path.read_text(errors="replace")), path
    (pyc,) = (venv / f"lib/python{python_minor()}/site-packages/agent/__pycache__").glob(
        "cli.*.pyc"
    )
    code = marshal.loads(pyc.read_bytes()[16:])
    assert code.co_filename == f"/{VENV}/lib/python{python_minor()}/site-packages/agent/cli.py"


def test_unpacked_agent_starts_as_the_unit_runs_it(
    package: Package, example_repo: Path, tmp_path: Path
) -> None:
    """The unit's ExecStart (the launcher, the shipped config, the venv's entry point) from the
    scratch copy, with systemd's notify socket stood in for by a real one: READY=1, then
    STOPPING=1."""
    venv = package.files / VENV
    unit = (package.files / UNIT).read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    program, *args = exec_start.removeprefix("ExecStart=").split()
    args = [str(package.files) + a if a.startswith("/etc/") else a for a in args]
    repo = copy_models(example_repo, tmp_path / "models", "mlp")
    # the config's paths under /var are the device's; here they point into the test's directory
    env = {
        **os.environ,
        "EDGEFLEET_AGENT_MODEL_REPOSITORY": str(repo),
        "EDGEFLEET_AGENT_RUNTIME__CACHE_DIR": str(tmp_path / "cache"),
        "EDGEFLEET_AGENT_FLEET__STATE_DIR": str(tmp_path / "fleet"),
        "EDGEFLEET_AGENT_PORT": "0",
        "EDGEFLEET_LAUNCHER_ROOT_DIR": str(tmp_path / "launcher"),
    }
    with tempfile.TemporaryDirectory(prefix="sd-") as directory:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(os.path.join(directory, "notify"))
            sock.settimeout(120)  # an upper bound on each wait for the next datagram
            env["NOTIFY_SOCKET"] = sock.getsockname()
            command = [str(venv / "bin/python"), str(package.files) + program, *args]
            proc = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
            try:
                seen: list[dict[str, str]] = []
                # the launcher says READY=1 once its agent said it (to the launcher's socket)
                ready = receive_until(sock, "READY", seen)
                assert ready["STATUS"] == "agent base running"
                proc.send_signal(signal.SIGTERM)
                assert receive_until(sock, "STOPPING", seen)["STOPPING"] == "1"
                assert proc.wait(timeout=60) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)


def test_unit_verifies_and_keeps_its_sandbox(package: Package, tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("needs systemd-analyze")
    # verify checks that ExecStart exists: point it at the unpacked copy, the rest as shipped
    unit = tmp_path / "edgefleet-agent.service"
    text = (package.files / UNIT).read_text()
    unit.write_text(text.replace("ExecStart=/opt/", f"ExecStart={package.files}/opt/"))
    verify = _run("systemd-analyze", "verify", str(unit))
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    security = _run("systemd-analyze", "security", "--offline=true", str(package.files / UNIT))
    exposure = re.search(r"Overall exposure level for \S+: ([\d.]+)", security.stdout)
    assert exposure is not None, security.stdout
    assert float(exposure.group(1)) <= 2.5, security.stdout


@pytest.fixture
def scratch_root(tmp_path: Path) -> Path:
    """An empty root with a user database and an empty dpkg database."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\nvideo:x:44:\n")
    (root / "etc/shadow").write_text("root:*:19000:0:99999:7:::\n")
    (root / "etc/gshadow").write_text("root:*::\nvideo:*::\n")
    for path in ("info", "updates"):
        (root / "var/lib/dpkg" / path).mkdir(parents=True)
    for path in ("status", "available"):
        (root / "var/lib/dpkg" / path).touch()
    return root


@pytest.mark.skipif(os.geteuid() != 0, reason="dpkg --root installs as root")
def test_install_reconfigure_remove_purge_in_a_scratch_root(
    package: Package, scratch_root: Path
) -> None:
    root = scratch_root
    dpkg = ["dpkg", f"--root={root}", "--force-script-chrootless"]

    def passwd_entry() -> list[str] | None:
        lines = [line.split(":") for line in (root / "etc/passwd").read_text().splitlines()]
        return next((line for line in lines if line[0] == "edgefleet"), None)

    # the dependencies (python3.11, passwd) are not in the scratch root's database
    install = _run(*dpkg, "--force-depends", "-i", str(package.deb))
    assert install.returncode == 0, install.stderr
    user = passwd_entry()
    assert user is not None and user[5:] == ["/var/lib/edgefleet", "/usr/sbin/nologin"]
    uid, gid = int(user[2]), int(user[3])
    assert uid < 1000  # a system user
    assert "video:x:44:edgefleet" in (root / "etc/group").read_text()
    for directory in (
        "var/lib/edgefleet",
        "var/lib/edgefleet/models",
        "var/lib/edgefleet/launcher",
        "var/cache/edgefleet",
    ):
        st = (root / directory).stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (uid, gid, 0o750), directory
    wants = root / "etc/systemd/system/multi-user.target.wants/edgefleet-agent.service"
    assert os.readlink(wants) == "/usr/lib/systemd/system/edgefleet-agent.service"

    # configure again (an upgrade from the same version): nothing changes, nothing fails
    before = {p: (root / p).read_bytes() for p in ("etc/passwd", "etc/group", "etc/shadow")}
    postinst = root / "var/lib/dpkg/info/edgefleet-agent.postinst"
    again = _run(
        "sh",
        str(postinst),
        "configure",
        f"{__version__}-1",
        env={**os.environ, "DPKG_ROOT": str(root)},
    )
    assert again.returncode == 0, again.stderr
    assert {p: (root / p).read_bytes() for p in before} == before

    remove = _run(*dpkg, "-r", "edgefleet-agent")
    assert remove.returncode == 0, remove.stderr
    assert not wants.exists() and not (root / VENV).exists()
    assert (root / "etc/edgefleet/agent.toml").exists()  # a conffile stays until purge
    assert passwd_entry() is not None and (root / "var/lib/edgefleet").exists()

    purge = _run(*dpkg, "-P", "edgefleet-agent")
    assert purge.returncode == 0, purge.stderr
    assert passwd_entry() is None
    assert "edgefleet" not in (root / "etc/group").read_text()
    assert not (root / "var/lib/edgefleet").exists() and not (root / "var/cache/edgefleet").exists()
    assert not (root / "etc/edgefleet").exists()
    # purging twice (a failed purge retried) is harmless
    purge_again = _run(
        "sh", str(package.control / "postrm"), "purge", env={**os.environ, "DPKG_ROOT": str(root)}
    )
    assert purge_again.returncode == 0, purge_again.stderr
