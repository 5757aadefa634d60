"""``edgefleet fleet dynsec-config`` never replaces a broker's plugin file by accident: the
broker keeps every enrolled device's user in it."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from common.cli import root


def test_an_existing_plugin_file_is_kept_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "dynamic-security.json"
    out.write_text('{"clients": ["enrolled devices"]}')
    args = ["fleet", "dynsec-config", "--out", str(out), "--state-dir", str(tmp_path / "cp")]
    refused = CliRunner().invoke(root(), args)
    assert refused.exit_code == 1
    assert "exists" in refused.output and "--force" in refused.output
    assert out.read_text() == '{"clients": ["enrolled devices"]}'
    forced = CliRunner().invoke(root(), [*args, "--force"])
    assert forced.exit_code == 0, forced.output
    assert "edgefleet-control-plane" in out.read_text()
