"""The agent's HTTP adapter (FastAPI) over the transport-free inference service."""
