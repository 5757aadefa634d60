"""Staged rollouts: a rollout's plan and spec (waves, gates, selector), the signed manifests it
publishes, the engine that moves it wave by wave, the telemetry health gates that judge each
wave, and the device events that move its devices. The states of both are stored ones:
:mod:`control_plane.db.states`."""
