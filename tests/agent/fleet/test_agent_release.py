"""The fleet client's side of an agent release (agent/fleet/agent_release.py), without a
broker: a signed release manifest offered to an agent that runs under no launcher is refused
(``no_launcher``) with the rollout it belongs to; one that failed its trial on this device is
not retried; a redelivery does nothing twice. Keys and the trust root are made per test."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agent.fleet.agent_release import AgentReleases
from agent.fleet.outcome import Report
from agent.fleet.settings import FleetSettings
from agent.launcher.journal import Journal, Outcome, ReleaseOutcome, load_pending, save_journal
from common.protocol.signing import SigningKey, sign_envelope
from tests.agent.fleet.publisher import new_trust_root
from tests.agent.launcher.test_verified import DEVICE, NOW, manifest, tarball


def offered(settings: FleetSettings, envelopes: list[dict[str, Any]]) -> list[Report]:
    """Offer ``envelopes`` in turn and collect what is reported until the handler is idle."""
    root_key, manifest_key = SigningKey.generate(), SigningKey.generate()
    trust = new_trust_root(root_key, [manifest_key])
    reports: list[Report] = []
    signed = [sign_envelope(e, manifest_key).model_dump(mode="json") for e in envelopes]

    expected = len({(e["version"], e["sequence"]) for e in envelopes})

    async def scenario() -> None:
        all_in = asyncio.Event()

        def report(r: Report) -> None:
            reports.append(r)
            if len(reports) >= expected:
                all_in.set()

        releases = AgentReleases(settings, DEVICE, lambda: trust, report)
        task = asyncio.create_task(releases.run())
        for envelope in signed:
            releases.offer(envelope)  # a redelivery is dropped here, before the queue
        async with asyncio.timeout(30):  # each refusal is reported once its turn came
            await all_in.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    return reports


def test_an_agent_under_no_launcher_refuses_with_the_reason(tmp_path: Path) -> None:
    body = manifest(tarball(tmp_path, "2.0.0"), "2.0.0", 3, rollout_id="rollout-7")
    settings = FleetSettings(device_id="dev-1", state_dir=tmp_path / "state")
    # offered twice (a redelivery): refused once
    (report,) = offered(settings, [body, body])
    assert (report.state, report.model, report.code) == ("rejected", "@agent", "no_launcher")
    assert (report.sequence, report.rollout_id) == (3, "rollout-7")
    assert report.reason is not None and "does not run under the launcher" in report.reason


def test_a_release_that_failed_its_trial_here_is_not_retried(tmp_path: Path) -> None:
    root = tmp_path / "launcher"
    root.mkdir()
    journal = Journal(
        current="2.0.0",
        failed={"3.0.0": "crashed before ready (exit 1): ImportError"},
        last_outcome=ReleaseOutcome(version="2.0.0", outcome=Outcome.COMMITTED, at=NOW),
    )
    save_journal(root / "launcher.json", journal)
    settings = FleetSettings(
        device_id="dev-1",
        state_dir=tmp_path / "state",
        launcher_journal_file=root / "launcher.json",
    )
    body = manifest(tarball(tmp_path, "3.0.0"), "3.0.0", 4, rollout_id="rollout-8")
    (report,) = offered(settings, [body])
    assert (report.state, report.code, report.rollout_id) == ("rejected", "replayed", "rollout-8")
    assert report.reason is not None
    assert report.reason.startswith("agent release 3.0.0 is not retried: it failed its trial")
    assert "edgefleet launcher retry 3.0.0" in report.reason
    assert load_pending(root) is None  # nothing asked of the launcher
