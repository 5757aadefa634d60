"""The operator commands of zero-touch provisioning, deployments and maintenance windows,
against a real control plane."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from common.cli import root
from runtimes.examples.variants import mlp_version
from tests.control_plane.enrolment.conftest import enrol
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_rollouts import push, validate


@pytest.mark.slow
def test_claims_enrolments_deployments_and_windows_from_the_cli(
    cp: RunningControlPlane, tmp_path: Path
) -> None:
    token = cp.token("operator", "ops")
    env = {"EDGEFLEET_URL": cp.url, "EDGEFLEET_TOKEN": token}
    cli = root()

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    claim = run(
        "claims", "create", "line-3", "--label", "group=pi", "--max-uses", "2", "--require-approval"
    ).strip()
    assert claim.startswith("efc_")
    assert "used 0/2, group=pi" in run("claims", "list")
    assert enrol(cp, claim, "dev-c").status_code == 202
    assert "dev-c: pending (raspberry-pi-5" in run("enrolments", "list", "--pending")
    assert run("enrolments", "approve", "dev-c", "--reason", "serial checked") == (
        "dev-c: approved\n"
    )
    revoked = json.loads(run("claims", "revoke", claim.split("_")[1], "--json"))
    assert revoked["state"] == "revoked"

    created = run(
        "windows",
        "create",
        "nights",
        "--cron",
        "0 2 * * *",
        "--duration",
        "3600",
        "--timezone",
        "Europe/Paris",
        "--selector",
        "group=pi",
    )
    assert created.startswith("nights: group=pi at '0 2 * * *' (Europe/Paris) for 3600 s: ")
    assert "nights" in run("windows", "list")
    assert run("windows", "delete", "nights") == "deleted nights\n"

    push(cp.admin, "mlp", 1, [(mlp_version(tmp_path / "v1", seed=1), [])])
    assert validate(cp.admin, "mlp", 1)["passed"]
    made = run(
        "deployments",
        "create",
        "pis",
        "mlp",
        "1",
        "--selector",
        "group=pi",
        "--gates",
        '{"allow_unjudged": true}',
    )
    assert made.startswith("pis: mlp v1 to group=pi: ")
    assert "pis: mlp v1" in run("deployments", "list")
    result = CliRunner().invoke(
        cli, ["deployments", "create", "x", "mlp", "1", "--selector", "nolabel"], env=env
    )
    assert result.exit_code == 2 and "expected label=value" in result.output
    assert run("deployments", "delete", "pis") == "deleted pis\n"
