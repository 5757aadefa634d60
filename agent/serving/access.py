"""Who may call the agent, and how often: API keys and a token bucket per client.

Keys are compared in constant time (over their SHA-256 digests, so a key's length leaks
nothing either), every configured key is checked on every request, and no key is ever logged:
clients are named by the name given in the keys file, or ``key-<n>``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections import OrderedDict
from pathlib import Path

from pydantic import SecretStr

from agent.errors import RateLimitedError, UnauthorizedError


class ApiKeys:
    """The accepted keys, by client name."""

    def __init__(self, keys: dict[str, str]) -> None:
        self._digests = [(name, _digest(key)) for name, key in keys.items()]

    @classmethod
    def from_settings(cls, key: SecretStr | None, keys_file: Path | None) -> ApiKeys | None:
        """None when no key is configured (the endpoint is open).

        Raises:
            ValueError: the keys file is unreadable, empty or has an empty key.
        """
        keys: dict[str, str] = {}
        if key is not None:
            keys["key-0"] = key.get_secret_value()
        if keys_file is not None:
            try:
                lines = keys_file.read_text().splitlines()
            except OSError as exc:
                raise ValueError(f"api_keys_file {keys_file}: {exc.strerror}") from None
            for n, line in enumerate(lines, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                name, sep, secret = line.partition(":")
                name = name.strip() if sep else f"key-{n}"
                if not secret.strip():
                    raise ValueError(f"api_keys_file {keys_file} line {n}: the key is empty")
                keys[name] = secret.strip()
            if not keys:
                raise ValueError(f"api_keys_file {keys_file}: holds no key")
        if any(not k for k in keys.values()):
            raise ValueError("api_key: must not be empty")
        return cls(keys) if keys else None

    def client(self, headers: dict[bytes, bytes]) -> str:
        """The name of the client whose key the request carries.

        Raises:
            UnauthorizedError: no key, or not one of ours.
        """
        offered = _offered(headers)
        if offered is None:
            raise UnauthorizedError(
                "an API key is required: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
            )
        digest = _digest(offered)
        found = None
        for name, known in self._digests:  # no early exit: the time does not depend on which
            if hmac.compare_digest(digest, known):
                found = name
        if found is None:
            raise UnauthorizedError("the API key is not valid")
        return found


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _offered(headers: dict[bytes, bytes]) -> str | None:
    api_key = headers.get(b"x-api-key")
    if api_key:
        return api_key.decode("latin-1").strip()
    scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


class RateLimiter:
    """A token bucket per client: ``burst`` requests at once, refilled at ``rate_per_s``.

    At most ``max_clients`` buckets are kept (least recently seen dropped first), so clients
    named by address cannot grow it without bound; a dropped client starts again full.
    """

    def __init__(self, rate_per_s: float, burst: int, max_clients: int = 10_000) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    @classmethod
    def from_settings(cls, rate_per_s: float | None, burst: int) -> RateLimiter | None:
        """None when no rate is configured (no limit). Each front end makes its own, so a
        client's REST and gRPC calls are counted apart."""
        return None if rate_per_s is None else cls(rate_per_s, burst)

    def take(self, client: str) -> None:
        """Spend one token of ``client``'s bucket.

        Raises:
            RateLimitedError: the bucket is empty; ``retry_after_s`` says when a token is back.
        """
        now = time.monotonic()
        tokens, last = self._buckets.pop(client, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate_per_s)
        if tokens < 1.0:
            self._buckets[client] = (tokens, now)
            wait = math.ceil((1.0 - tokens) / self.rate_per_s)
            raise RateLimitedError(
                f"client {client} is over rate_limit_per_s={self.rate_per_s:g} "
                f"(burst {self.burst})",
                retry_after_s=max(1, wait),
            )
        self._buckets[client] = (tokens - 1.0, now)
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
