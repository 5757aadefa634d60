"""What the server says of itself (V2 server metadata: ``GET /v2``, ``ServerMetadata``)."""

from __future__ import annotations

SERVER_NAME = "edgefleet"

EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "model_repository",
    "schedule_policy",
    "statistics",
    "model_configuration",
    "system_shared_memory",
]
"""The KServe V2 / Triton extensions served, over REST and gRPC alike."""
