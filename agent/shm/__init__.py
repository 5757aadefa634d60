"""Triton's system shared memory extension: POSIX regions (``/dev/shm``) that local clients
register, the agent reads inputs from and writes outputs into (:mod:`agent.shm.regions`),
reached over HTTP (:mod:`agent.api.sharedmemory`) and gRPC (:mod:`agent.grpc.servicer`).
Infer requests of both name regions per tensor; :mod:`agent.shm.tensors` reads and writes the
tensors there, :mod:`agent.shm.answers` holds a REST request's regions until it is answered."""
