"""The variables gRPC core reads once, when grpcio loads: set by the composition root from the
settings before anything imports grpc (this module does not).

- ``GRPC_VERBOSITY`` from ``grpc.core_log``: ``NONE`` by default, since gRPC core writes absl
  text lines (``I1207 01:07:36.653618 10992 fork_posix.cc:71] ...``) on file descriptor 2,
  past Python's logging, into a log where every other line is JSON.
- ``GRPC_ENABLE_FORK_SUPPORT=false``: the agent's children (Python step workers) exec at once
  and never call gRPC, so gRPC core's fork handlers have nothing to do; with them, each fork
  while gRPC's threads run printed "Other threads are currently calling into gRPC, skipping
  fork() handlers".
"""

from __future__ import annotations

from agent.settings import GrpcSettings


def core_environment(settings: GrpcSettings) -> dict[str, str]:
    return {
        "GRPC_VERBOSITY": settings.core_log.value.upper(),
        "GRPC_ENABLE_FORK_SUPPORT": "false",
    }
