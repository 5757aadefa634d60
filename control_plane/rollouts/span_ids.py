"""The span ids of a rollout's spans kept open on its row (:mod:`.tracing`): the SDK's random
ids, except inside :meth:`StoredIds.fixed`. Imports the OpenTelemetry SDK: imported only
where ``[tracing] enabled``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from opentelemetry.sdk.trace.id_generator import RandomIdGenerator


class StoredIds(RandomIdGenerator):
    """The SDK's id generator, but inside :meth:`fixed` the ids stored on a rollout's row: a
    span opened by an earlier step (maybe another process's) is exported as the span whose
    id its children already name. The stored ids were drawn by this generator: random."""

    def __init__(self) -> None:
        self._fixed: ContextVar[tuple[int, int] | None] = ContextVar("fixed_ids", default=None)

    def generate_span_id(self) -> int:
        fixed = self._fixed.get()
        return fixed[1] if fixed else super().generate_span_id()

    def generate_trace_id(self) -> int:
        fixed = self._fixed.get()
        return fixed[0] if fixed else super().generate_trace_id()

    @contextlib.contextmanager
    def fixed(self, trace_id: int, span_id: int) -> Iterator[None]:
        """Ids of the spans started within: ``trace_id`` (for a root span) and ``span_id``.
        Start only one span inside."""
        token = self._fixed.set((trace_id, span_id))
        try:
            yield
        finally:
            self._fixed.reset(token)
