"""The agent's fleet client: follows the desired state published for this device over MQTT,
verifies and applies signed manifests, reports status, events and telemetry. Off unless
``fleet.mqtt_url`` is set; the agent serves locally with or without it."""
