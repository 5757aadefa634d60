"""The control plane's keys (manifest and root) and the fleet's trust root: created on first
start, published, rotated and revoked."""
