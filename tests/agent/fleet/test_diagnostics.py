"""The agent's side of log and bundle requests, without a broker: which lines a request
gets, what a bundle's config shows of secrets, and the chunked upload's resends."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import SecretStr

from agent.fleet.diagnostics import DiagnosticUploader, read_logs, redacted, scrub, secret_values
from agent.fleet.settings import FleetSettings
from agent.main import agent_secrets
from agent.settings import AgentSettings
from common.protocol.diagnostics import MAX_CHUNK_BYTES, DiagnosticAck
from common.protocol.messages import Command, CommandType

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def line(at: datetime, level: str, message: str) -> str:
    return json.dumps({"level": level, "message": message, "time": at.isoformat()}) + "\n"


def test_lines_are_read_oldest_file_first_filtered_and_the_newest_kept(tmp_path: Path) -> None:
    path = tmp_path / "agent.jsonl"
    (tmp_path / "agent.jsonl.2").write_text(line(T0, "INFO", "a") + line(T0, "ERROR", "b"))
    (tmp_path / "agent.jsonl.1").write_text(line(T0 + timedelta(minutes=1), "WARNING", "c"))
    path.write_text(line(T0 + timedelta(minutes=2), "DEBUG", "d") + "not json\n")

    def messages(**kwargs: object) -> list[str]:
        return [json.loads(x)["message"] for x in read_logs(path, **kwargs).splitlines()]  # type: ignore[arg-type]

    assert messages() == ["a", "b", "c", "d"]
    assert messages(min_level="WARNING") == ["b", "c"]
    assert messages(since=T0 + timedelta(seconds=30), until=T0 + timedelta(minutes=1)) == ["c"]
    newest = len(line(T0, "DEBUG", "d"))
    assert messages(max_bytes=newest) == ["d"]  # the newest that fit
    assert read_logs(tmp_path / "none.jsonl") == b""


def test_a_bundles_config_shows_no_secret() -> None:
    settings = FleetSettings(
        password=SecretStr("pw-123456"), claim_token=SecretStr("efc_tok"), enrol_url="https://cp"
    )
    shown = redacted(settings)
    assert shown["password"] == shown["claim_token"] == "[redacted]"
    assert shown["device_id"] == settings.device_id
    assert sorted(secret_values(settings)) == ["efc_tok", "pw-123456"]
    text = json.dumps({"said": 'pw-"quoted"'}).encode()
    assert scrub(text, ['pw-"quoted"']) == b'{"said": "[redacted]"}'


def test_chunks_are_resent_until_acknowledged_and_go_on_from_the_ack() -> None:
    data = bytes(range(256)) * (MAX_CHUNK_BYTES // 256 * 2 + 1)  # three chunks

    async def build(command: Command) -> bytes:
        return data

    async def scenario() -> None:
        up = DiagnosticUploader("dev", resend_s=5.0, build=build)
        now = T0
        up.request(
            Command(
                command_id="r1",
                device_id="dev",
                type=CommandType.LOGS,
                issued_at=now,
                expires_at=now + timedelta(hours=1),
            )
        )
        first = await up.next_upload(0.0)
        assert first is not None and first.offset == 0 and first.total_bytes == len(data)
        assert await up.next_upload(1.0) is None  # in flight, not due
        again = await up.next_upload(5.0)  # not acknowledged in time: sent again
        assert again is not None and again.offset == 0
        up.acknowledged(
            DiagnosticAck(device_id="dev", request_id="r1", received_bytes=MAX_CHUNK_BYTES)
        )
        second = await up.next_upload(5.1)
        assert second is not None and second.offset == MAX_CHUNK_BYTES
        up.reconnected()  # the session lost: sent again at once
        resent = await up.next_upload(5.2)
        assert resent is not None and resent.offset == MAX_CHUNK_BYTES
        got = base64.b64decode(first.data_b64) + base64.b64decode(second.data_b64)
        up.acknowledged(DiagnosticAck(device_id="dev", request_id="r1", received_bytes=len(got)))
        third = await up.next_upload(5.3)
        assert third is not None
        got += base64.b64decode(third.data_b64)
        assert got == data
        up.acknowledged(
            DiagnosticAck(device_id="dev", request_id="r1", received_bytes=len(data), done=True)
        )
        assert await up.next_upload(100.0) is None

    asyncio.run(scenario())


def test_the_keys_in_the_claim_token_and_api_keys_files_are_secrets_too(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# a comment\ncam:k-secret-1\n")
    claim = tmp_path / "claim"
    claim.write_text("efc_claim-secret\n")
    settings = AgentSettings(
        model_repository=tmp_path,
        api_keys_file=keys,
        fleet=FleetSettings(
            password=SecretStr("pw-xyz1"), enrol_url="https://cp", claim_token_file=claim
        ),
    )
    assert sorted(agent_secrets(settings)) == ["efc_claim-secret", "k-secret-1", "pw-xyz1"]
