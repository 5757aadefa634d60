"""What every front end of the agent shares, so that none imports another.

REST (:mod:`agent.api`), gRPC (:mod:`agent.grpc`) and the OpenAI-compatible front end to come
are adapters over the inference service; each holds its own wire codec and its own
class -> status table, and takes the rest from here:

- :mod:`agent.serving.state`: what a front end reaches (service, manager, metrics, settings,
  shared memory) and the server's readiness;
- :mod:`agent.serving.access`: API keys and the rate limit per client;
- :mod:`agent.serving.errors`: which errors are the domain's, their codes, and which turn a
  request away (the refusal reasons counted);
- :mod:`agent.serving.metadata`: the server's name and the V2 extensions it serves;
- :mod:`agent.serving.classification`: Triton's classification extension, one ranking for
  every wire.

Nothing here knows HTTP or gRPC.
"""
