"""Triton's system shared memory extension: POSIX regions (``/dev/shm``) that local clients
register, the agent reads inputs from and writes outputs into (:mod:`agent.shm.regions`),
reached over HTTP (:mod:`agent.api.sharedmemory`) and gRPC (:mod:`agent.grpc.servicer`)."""
