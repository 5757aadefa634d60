"""Serving benchmarks: a lean load generator and side-by-side runs of the agent and its
baselines (``python -m benchmarks.serving.serving``)."""
