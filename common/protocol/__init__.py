"""The wire between agents and the control plane: topics, versioned messages, signed manifests.

Imports only the standard library, pydantic and cryptography; both sides import it, and the
JSON Schemas in ``docs/schemas/`` are exported from it (a test fails when they drift).
"""

SCHEMA_VERSION = 1
