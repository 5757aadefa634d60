"""KServe V2 / Triton gRPC (``inference.GRPCInferenceService``): a thin adapter over the
agent's inference service, on grpcio's asyncio server in the agent's own event loop.

- :mod:`agent.grpc.codec`: ``ModelInferRequest`` <-> numpy, shared memory included;
- :mod:`agent.grpc.status`: domain errors -> gRPC status codes;
- :mod:`agent.grpc.servicer`: the RPCs;
- :mod:`agent.grpc.server`: binding, start and stop with the HTTP server's lifespan;
- :mod:`agent.grpc.proto`: the protos and the code generated from them.

Nothing here is imported unless ``grpc.enabled`` is set; its settings, the ``grpc`` section,
are :class:`agent.settings.GrpcSettings`. What it shares with REST (access, readiness, error
classification) it takes from :mod:`agent.serving`, never from the REST front end.
"""
