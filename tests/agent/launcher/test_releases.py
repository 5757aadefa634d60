"""Release folders: installed whole or not at all, refused with a reason naming the field, and
the pending request's refusals (in process: these steps are plain functions over files)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from agent.launcher.journal import BASE, Journal, PendingRelease, save_pending
from agent.launcher.releases import ReleaseError, Releases
from agent.launcher.requests import recover, take_pending
from tests.agent.launcher.harness import build_release, cli


def tree(tmp_path: Path, info: dict[str, object]) -> Path:
    folder = tmp_path / "src"
    (folder / "lib").mkdir(parents=True)
    (folder / "release.json").write_text(json.dumps(info))
    return folder


@pytest.mark.parametrize(
    ("info", "field"),
    [
        ({"version": "base"}, "version"),
        ({"version": "../escape"}, "version"),
        ({"version": "2.0.0", "python": "/usr/bin/python3"}, "python"),
        ({"version": "2.0.0", "python": "../../bin/python"}, "python"),
        ({"version": "2.0.0", "entry": "os; rm"}, "entry"),
        ({"version": "2.0.0", "surprise": 1}, "surprise"),
    ],
)
def test_invalid_release_is_refused_naming_the_field(
    tmp_path: Path, info: dict[str, object], field: str
) -> None:
    releases = Releases(tmp_path / "releases")
    with pytest.raises(ReleaseError, match=field):
        releases.install(tree(tmp_path, info))
    assert list((tmp_path / "releases").iterdir()) == []  # no folder, no staging left


def test_tarball_installs_and_escaping_members_are_refused(tmp_path: Path) -> None:
    source = build_release(tmp_path, "2.0.0", "good")
    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz") as tar:
        tar.add(source, arcname=".")
    releases = Releases(tmp_path / "releases")
    assert releases.install(good).version == "2.0.0"
    assert (releases.path("2.0.0") / "lib" / "edgefleet_release.py").is_file()

    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        for name, data in (("release.json", b'{"version": "3.0.0"}'), ("../outside", b"x")):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    with pytest.raises(ReleaseError, match="outside"):
        releases.install(evil)
    assert not (tmp_path / "releases" / "outside").exists()
    assert sorted(p.name for p in (tmp_path / "releases").iterdir()) == ["2.0.0"]


def test_cli_refuses_a_duplicate_and_an_unknown_retry(tmp_path: Path) -> None:
    root = tmp_path / "launcher"
    source = build_release(tmp_path, "2.0.0", "good")
    assert (
        cli("launcher", "install", "--root", str(root), "--no-trial", str(source)).returncode == 0
    )
    again = cli("launcher", "install", "--root", str(root), str(source))
    assert again.returncode == 1
    assert again.stderr.startswith("Error: release 2.0.0 is installed already")
    retry = cli("launcher", "retry", "--root", str(root), "9.9.9")
    assert retry.returncode == 2
    assert "Invalid value for VERSION: release 9.9.9 is not installed" in retry.stderr
    assert not (root / "pending.json").exists()


def test_pending_release_refusals(tmp_path: Path) -> None:
    root = tmp_path / "launcher"
    releases = Releases(root / "releases")
    releases.install(build_release(tmp_path, "3.0.0", "crashing"))
    journal = Journal(failed={"3.0.0": "crashed before ready (exit 1): ImportError: x"})

    save_pending(root, PendingRelease(version="7.0.0"))
    assert take_pending(journal, releases)
    assert journal.last_outcome is not None
    assert journal.last_outcome.reason == "release 7.0.0 is not installed"

    save_pending(root, PendingRelease(version="3.0.0"))
    assert take_pending(journal, releases)
    assert journal.current == BASE and journal.trial is None
    assert journal.last_outcome.reason == (
        "not retried: it failed its trial (crashed before ready (exit 1): ImportError: x)"
    )

    save_pending(root, PendingRelease(version="3.0.0", retry=True))
    assert take_pending(journal, releases)
    assert journal.current == "3.0.0" and journal.failed == {}
    assert journal.trial is not None and journal.trial.previous == BASE


def test_missing_current_release_falls_back(tmp_path: Path) -> None:
    releases = Releases(tmp_path / "releases")
    journal = Journal(current="5.0.0", previous="4.0.0")  # both folders gone
    recover(journal, releases)
    assert journal.current == BASE
    assert journal.last_error == "release 5.0.0 is not installed; running base"
