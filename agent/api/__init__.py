"""The REST front end (FastAPI): KServe V2 and TF Serving routes and their codecs, admission,
the request context, the infer fast path and the HTTP error table.

An adapter over the inference service: what it shares with the other front ends (access,
readiness, error classification) is :mod:`agent.serving`'s, the HTTP server under it is
:mod:`agent.http`'s.
"""
