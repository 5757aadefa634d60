"""Zero-touch provisioning, the device's side: on the first start, exchange the claim token for
this device's broker identity and the trust root, and keep them.

    no identity.json --POST enrol--> 201: trust-root.json, then identity.json (both atomic)
                                     202: pending; ask again after Retry-After
                                     401/403/409: refused; the reason is logged, no retry
                                     429, 503: again after Retry-After, with jitter
                                     unreachable, other 5xx: again, with backoff

The device key (``enrol-key``, made once) proves on every later request that it is the device
that first asked for this id. Once ``identity.json`` exists, later starts use it and never ask
again; delete it (and the key) to enrol anew with a fresh claim.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from agent.fleet.settings import FleetSettings
from agent.fleet.state import StateFiles
from common import __version__
from common.files import write_atomically
from common.protocol.enrolment import (
    ENROL_PATH,
    EnrolmentAnswer,
    EnrolmentRequest,
    EnrolmentStatus,
)
from common.protocol.signing import TrustRoot

log = logging.getLogger("edgefleet.agent.fleet.enrol")
REQUEST_TIMEOUT_S = 30.0
RETRY_AFTER_JITTER = (1.0, 1.5)
"""A busy control plane's Retry-After is stretched by this factor, drawn anew each time: never
sooner than it asked, and a fleet refused at once does not come back at once."""


class EnrolmentFailed(Exception):
    """The control plane refused the claim: ``reason`` says why (claim_expired, ...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"enrolment refused ({reason}): {message}")
        self.reason = reason


class StoredIdentity(BaseModel):
    """What enrolment gave this device: its broker login (``identity.json``, mode 0600)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device_id: str
    username: str
    password: SecretStr


def identity_path(state_dir: Path) -> Path:
    return state_dir / "identity.json"


def load_identity(state_dir: Path, device_id: str) -> StoredIdentity | None:
    """The identity enrolment stored for ``device_id``; None if there is none, or it is another
    id's (the device was renamed: it enrols again under its new id, if its claim allows)."""
    path = identity_path(state_dir)
    if not path.is_file():
        return None
    identity = StoredIdentity.model_validate_json(path.read_bytes())
    if identity.device_id != device_id:
        log.warning(
            "the stored identity is another device id's: not used",
            extra={"stored": identity.device_id, "device_id": device_id},
        )
        return None
    return identity


def _claim(settings: FleetSettings) -> str:
    if settings.claim_token is not None:
        return settings.claim_token.get_secret_value()
    assert settings.claim_token_file is not None  # settings.enrols
    return settings.claim_token_file.read_text().rstrip("\r\n")


def _device_key(state_dir: Path) -> str:
    path = state_dir / "enrol-key"
    if path.is_file():
        return path.read_text().strip()
    key = secrets.token_urlsafe(32)
    write_atomically(path, key.encode())  # mode 0600 (mkstemp)
    return key


class Enrolment:
    def __init__(self, settings: FleetSettings, files: StateFiles, hardware_profile: str) -> None:
        self.settings = settings
        self.files = files
        self.hardware_profile = hardware_profile

    async def run(self) -> StoredIdentity:
        """Ask until enrolled; return the identity, stored.

        Raises:
            EnrolmentFailed: refused (an expired, revoked or used-up claim, a rejection...).
        """
        s = self.settings
        claim = _claim(s)
        request = EnrolmentRequest(
            device_id=s.device_id,
            device_key=_device_key(s.state_dir),
            hardware_profile=self.hardware_profile,
            labels=dict(s.labels),
            agent_version=__version__,
        )
        url = (s.enrol_url or "").rstrip("/") + ENROL_PATH
        delay = s.reconnect_min_s
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
            while True:
                wait = delay * random.uniform(0.8, 1.2)
                try:
                    answer = await self._ask(client, url, claim, request)
                except _Busy as exc:  # its Retry-After, not our backoff
                    wait = jittered_retry_after(exc.retry_after_s)
                    log.info(
                        "enrolment: control plane busy",
                        extra={
                            "error": str(exc),
                            "retry_after_s": exc.retry_after_s,
                            "retry_in_s": round(wait, 2),
                        },
                    )
                except (httpx.HTTPError, _Transient) as exc:
                    log.warning(
                        "enrolment: control plane unavailable",
                        extra={"error": str(exc), "retry_in_s": round(wait, 2)},
                    )
                    delay = min(s.enrol_retry_max_s, delay * 2)
                else:
                    if answer.status is EnrolmentStatus.ENROLLED:
                        return self._store(answer)
                    wait = answer.retry_after_s or s.enrol_retry_max_s
                    log.info(
                        "enrolment pending: waiting for an operator's approval",
                        extra={"device_id": s.device_id, "retry_in_s": wait},
                    )
                    wait *= random.uniform(0.8, 1.2)
                await asyncio.sleep(wait)

    async def _ask(
        self, client: httpx.AsyncClient, url: str, claim: str, request: EnrolmentRequest
    ) -> EnrolmentAnswer:
        headers = {"content-type": "application/json", "authorization": f"Bearer {claim}"}
        resp = await client.post(url, content=request.model_dump_json(), headers=headers)
        if resp.status_code in (200, 201, 202):
            try:
                return EnrolmentAnswer.model_validate_json(resp.content)
            except ValidationError as exc:
                raise _Transient(f"not an enrolment answer: {exc.errors()[0]['msg']}") from None
        if resp.status_code in (401, 403, 409):
            try:
                doc = resp.json()
            except ValueError:
                doc = {}
            raise EnrolmentFailed(
                str(doc.get("reason", resp.status_code)), str(doc.get("error", resp.text[:300]))
            )
        retry_after = retry_after_s(resp)
        if resp.status_code in (429, 503) and retry_after is not None:
            raise _Busy(f"HTTP {resp.status_code}: {resp.text[:300]}", retry_after)
        raise _Transient(f"HTTP {resp.status_code}: {resp.text[:300]}")

    def _store(self, answer: EnrolmentAnswer) -> StoredIdentity:
        s = self.settings
        if answer.topic_prefix and answer.topic_prefix != s.topic_prefix:
            raise EnrolmentFailed(
                "topic_prefix",
                f"the fleet's topic prefix is {answer.topic_prefix!r}, this device's "
                f"{s.topic_prefix!r}: set fleet.topic_prefix",
            )
        if answer.username is None or answer.password is None or answer.trust_root is None:
            raise EnrolmentFailed("malformed", "the answer lacks the identity or the trust root")
        pinned = s.trust_root_file is not None and s.trust_root_file.is_file()
        if not pinned and not self.files.trust_path.is_file():
            # the trust root first: an identity without it would be a device that trusts nothing
            signed = answer.trust_root.get("signed", answer.trust_root)
            self.files.save_trust(TrustRoot.model_validate(signed))
        identity = StoredIdentity(
            device_id=answer.device_id,
            username=answer.username,
            password=SecretStr(answer.password),
        )
        doc = {**identity.model_dump(), "password": answer.password}
        write_atomically(identity_path(s.state_dir), json.dumps(doc).encode())  # mode 0600
        log.info("enrolled", extra={"device_id": answer.device_id})
        return identity


def retry_after_s(resp: httpx.Response) -> float | None:
    """The answer's ``Retry-After`` in seconds; None without one, or in the HTTP-date form
    (NOTE: RFC 9110, 10.2.3: the control plane sends delay-seconds)."""
    value = resp.headers.get("retry-after", "").strip()
    return float(value) if value.isdigit() else None


def jittered_retry_after(retry_after_s: float) -> float:
    """How long to wait when told ``Retry-After: retry_after_s`` (:data:`RETRY_AFTER_JITTER`)."""
    return retry_after_s * random.uniform(*RETRY_AFTER_JITTER)


class _Transient(Exception):
    pass


class _Busy(_Transient):
    """429 or 503 with a Retry-After: the control plane says when to ask again."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
