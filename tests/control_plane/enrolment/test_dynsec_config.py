"""``edgefleet fleet dynsec-config`` never replaces a broker's plugin file by accident: the
broker keeps every enrolled device's user in it. A file written before the control plane had
a listener of its own (its user among the plugin's) is kept, with the commands to remove it."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from common.cli import root
from control_plane.provisioning.dynsec_broker import find_plugin


def test_an_existing_plugin_file_is_kept_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "broker"
    plugin_file = out / "data" / "dynamic-security.json"
    plugin_file.parent.mkdir(parents=True)
    before = {"clients": [{"username": "edgefleet-control-plane"}, {"username": "dev-1"}]}
    plugin_file.write_text(json.dumps(before))
    args = ["fleet", "dynsec-config", "--out", str(out), "--state-dir", str(tmp_path / "cp")]
    args += ["--plugin", str(find_plugin() or "/usr/lib/mosquitto_dynamic_security.so")]
    kept = CliRunner().invoke(root(), args)
    assert kept.exit_code == 0, kept.output
    assert json.loads(plugin_file.read_text()) == before
    assert "kept" in kept.output and "--force" in kept.output
    assert "deleteClient edgefleet-control-plane" in kept.output
    assert f"plugin_opt_config_file {plugin_file}" in (out / "mosquitto.conf").read_text()
    forced = CliRunner().invoke(root(), [*args, "--force"])
    assert forced.exit_code == 0, forced.output
    assert json.loads(plugin_file.read_text())["clients"] == []
    assert "deleteClient" not in forced.output


def test_a_listener_beyond_loopback_needs_to_be_asked_for(tmp_path: Path) -> None:
    args = ["fleet", "dynsec-config", "--out", str(tmp_path / "b"), "--bind", "0.0.0.0"]
    refused = CliRunner().invoke(root(), [*args, "--state-dir", str(tmp_path / "cp")])
    assert refused.exit_code == 2 and "--allow-plaintext" in refused.output
    assert not (tmp_path / "b").exists()
