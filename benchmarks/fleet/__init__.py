"""Fleet-scale benchmark: a device simulator speaking the real protocol, a bare subscriber,
and the driver that measures rollouts, rollbacks and telemetry ingest against a real
Mosquitto and a real control plane (``python -m benchmarks.fleet.fleet``)."""
