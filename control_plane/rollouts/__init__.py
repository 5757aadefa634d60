"""Staged rollouts: a rollout's plan and spec (waves, gates, selector), the signed manifests it
publishes, the engine that moves it wave by wave, the telemetry health gates that judge each
wave, the device events that move its devices, and the states of both (:mod:`.states`)."""
