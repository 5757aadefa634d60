"""Benchmarks: a lean load generator and side-by-side runs (``python -m agent.bench.serving``)."""
