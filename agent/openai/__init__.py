"""The OpenAI-compatible front end: an adapter over the generative core, beside REST
(:mod:`agent.api`) and gRPC (:mod:`agent.grpc`), on the agent's REST port and Unix socket.

- :mod:`agent.openai.routes`: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``,
  whole or as server-sent events;
- :mod:`agent.openai.schema`: the request bodies, validated (400 naming the field);
- :mod:`agent.openai.shapes`: the response and chunk objects;
- :mod:`agent.openai.errors`: domain errors -> OpenAI's error shape and statuses.

Mounted by :func:`agent.api.app.create_app` only when generative models are served.
"""
