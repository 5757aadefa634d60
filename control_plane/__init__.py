"""The edgefleet control plane: model registry, device inventory, staged rollouts with health
gates and automatic rollback, telemetry store, operator API and CLI."""
