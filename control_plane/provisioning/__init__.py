"""Broker access for a fleet: per-device MQTT credentials (Mosquitto password file), the ACL that
confines each device to its own topics, and a small CA that issues device and broker
certificates for mutual TLS. Written as Mosquitto configuration by ``edgefleet fleet``."""
