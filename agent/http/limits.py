"""The bounds of the agent's HTTP server, and the counts one server's connections share.

:class:`HttpLimits` is what :func:`agent.main.server_config` configures;
:class:`InFlight` and :class:`BodyBudget` are the state every connection of one server
counts against (requests whose response is not complete, bytes of request bodies held), made
once per server by :func:`agent.http.protocol.protocol_class`. They live apart from the
protocol so that the composition root sizes the server without reading the protocol's code,
and the sizes the protocol reads by sit next to the limits they serve.
"""

from __future__ import annotations

from dataclasses import dataclass

BUFFERED_BODY_BYTES = 64 * 1024
"""A body collected whole from this size up is read straight into its buffer and handed over
as it is, and its connection reads through :class:`agent.http.protocol._Reader` from then
on. Smaller bodies are copied: for a request of a few kilobytes the copies cost less than the
calls the buffered reads and the handler's own ``receive`` add (measured: ``mlp`` JSON at
concurrency 32 served about 8 % fewer requests with every connection buffered)."""
HEAD_READ_BYTES = 8 * 1024
"""What one read takes on a connection reading through
:class:`agent.http.protocol._Reader`, outside a body collected whole: a request's head and
the start of its body. A read that fills it is followed at once by the next, into the body's
buffer. With a read buffer of 256 KiB (uvloop's size), a third of a 600 KB body arrived with
its head and was copied from there by the parser's callback: 11 % of the event loop's time
serving a light model of ``cnn``'s shape (py-spy, 2026-12-04)."""


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    max_concurrent_requests: int
    open_paths: frozenset[bytes] = frozenset()
    """Paths never refused for load (health probes)."""
    whole_body_bytes: int = 0
    """A body declaring at most this many bytes is collected whole before its handler hears of
    it; 0 leaves every body to uvicorn's 64 KiB steps."""
    max_inflight_body_bytes: int = 0
    """Bytes of request bodies the server's connections may hold at once; 0: no budget."""


def default_body_budget_bytes(memory_budget_bytes: int | None, max_request_bytes: int) -> int:
    """``max_inflight_body_bytes`` when it is not set: a quarter of the memory budget models may
    use, within 64 MiB and 1 GiB (256 MiB when the memory is not known), and never under one
    body of ``max_request_bytes``."""
    if memory_budget_bytes is None:
        share = 256 * 2**20
    else:
        share = max(64 * 2**20, min(memory_budget_bytes // 4, 2**30))
    return max(share, max_request_bytes)


@dataclass
class InFlight:
    """Requests of one server whose response is not complete yet."""

    count: int = 0


@dataclass
class BodyBudget:
    """Bytes of request bodies one server's connections hold, against ``limit`` (0: none).
    Changed on the event loop only."""

    limit: int
    used: int = 0

    def fits(self, size: int) -> bool:
        return not self.limit or self.used + size <= self.limit
