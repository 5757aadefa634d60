"""The project's benchmarks, kept out of the wheel and the .deb (devices never run them).

- :mod:`.serving`: the agent against raw ONNX Runtime, a plain FastAPI endpoint and MLServer;
  footprint.
- :mod:`.fleet`: fleet scale with a device simulator against a real broker and control plane.
- :mod:`.startup`: cold against warm start with the compiled-model caches.

``python -m benchmarks`` runs the suite and writes ``docs/benchmarks.md`` and ``runs.md`` here
(README.md says more).
"""
