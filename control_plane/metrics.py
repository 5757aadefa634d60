"""The control plane's /metrics: fleet-level series for Prometheus and Grafana."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from control_plane.ingest.presence import Presence, SilenceRule


@dataclass
class VersionSums:
    """One batch's telemetry of one model version, summed."""

    requests: int = 0
    errors: int = 0
    rows: int = 0
    worst_p99_ms: float | None = None


class FleetMetrics:
    def __init__(self, silence: SilenceRule | None = None) -> None:
        """``silence``: when an online device that has gone quiet counts as silent (default:
        never)."""
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "edgefleet_fleet_requests",
            "Inference requests reported by devices",
            ["model", "version"],
            registry=r,
        )
        self.errors = Counter(
            "edgefleet_fleet_errors",
            "Model errors reported by devices",
            ["model", "version"],
            registry=r,
        )
        self.rows = Counter(
            "edgefleet_fleet_rows",
            "Rows inferred, reported by devices",
            ["model", "version"],
            registry=r,
        )
        self.p99 = Gauge(
            "edgefleet_fleet_p99_ms",
            "Largest p99 latency in the last telemetry batch",
            ["model", "version"],
            registry=r,
        )
        self.telemetry = Counter(
            "edgefleet_telemetry_messages", "Telemetry messages stored", registry=r
        )
        self.events = Counter("edgefleet_update_events", "Update events stored", registry=r)
        self.rejects = Counter(
            "edgefleet_messages_rejected", "Device messages refused", ["topic", "code"], registry=r
        )
        self.read_pauses = Counter(
            "edgefleet_mqtt_read_pauses",
            "Times reading device messages stopped while the ingest queue was full",
            registry=r,
        )
        self.reading_paused = Gauge(
            "edgefleet_mqtt_reading_paused",
            "1 while reading device messages is stopped because the ingest queue is full (the"
            " broker holds them), else 0",
            registry=r,
        )
        self.reused_packet_ids = Counter(
            "edgefleet_mqtt_reused_packet_ids",
            "Device messages the broker sent under a packet id still awaiting our acknowledgement"
            " (a broker fault; each is acknowledged once, see control_plane.mqtt.wire)",
            registry=r,
        )
        self.batch_seconds = Histogram(
            "edgefleet_ingest_batch_seconds",
            "Time to write one batch of device messages to the database (its transaction)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.batch_messages = Histogram(
            "edgefleet_ingest_batch_messages",
            "Device messages per batch written",
            buckets=(1, 10, 100, 1_000, 5_000, 10_000, 20_000, 50_000),
            registry=r,
        )
        self.drift_psi = Gauge(
            "edgefleet_input_drift_psi",
            "Largest PSI of any input feature against the version's reference set, over the"
            " fleet's recent windows (device='*') or the worst device's",
            ["model", "version", "device"],
            registry=r,
        )
        self.drift_alerts = Counter(
            "edgefleet_input_drift_alerts",
            "Times a device's or the fleet's input drift went over the threshold",
            ["model", "version"],
            registry=r,
        )
        self.silence = silence or SilenceRule(0)
        self.listening_since: datetime | None = None
        """When the control plane's broker session began (set by the bus; None: not
        connected)."""
        self.storing_since: datetime | None = datetime.now(UTC)
        """When the database last came back (set by the ingest; None: unavailable now, device
        messages wait unstored)."""
        self._status: dict[str, tuple[bool, float | None]] = {}
        """Per device: online by its last status, and the telemetry interval it announced."""
        self._heard: dict[str, datetime] = {}
        self.rollout_states: dict[str, int] = {}
        r.register(_StateCollector(self))

    @property
    def hearing_since(self) -> datetime | None:
        """Since when device messages both arrive and are stored (None: one of them stopped):
        silence is counted from here at the earliest, so a control plane that could not hear
        or store does not blame the devices."""
        if self.listening_since is None or self.storing_since is None:
            return None
        return max(self.listening_since, self.storing_since)

    def set_online(
        self, device_id: str, online: bool, interval_s: float | None, at: datetime
    ) -> None:
        """A device's status message, stored at ``at``."""
        self._status[device_id] = (online, interval_s)
        self._heard[device_id] = at

    def heard(self, seen: Mapping[str, datetime], at: datetime) -> None:
        """Devices whose messages were stored at ``at``."""
        self._heard.update(dict.fromkeys(seen, at))

    def rejected(self, topic: str, code: str) -> None:
        self.rejects.labels(topic, code).inc()

    def ingested(
        self, per_version: dict[tuple[str, int], VersionSums], messages: int, events: int
    ) -> None:
        """Count one stored batch, summed per model version (by the ingest), so the counters
        move once per version and batch rather than once per sample."""
        self.telemetry.inc(messages)
        self.events.inc(events)
        for (model, version), sums in per_version.items():
            key = (model, str(version))
            self.requests.labels(*key).inc(sums.requests)
            self.errors.labels(*key).inc(sums.errors)
            self.rows.labels(*key).inc(sums.rows)
            if sums.worst_p99_ms is not None:
                self.p99.labels(*key).set(sums.worst_p99_ms)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect_state(self) -> Iterator[GaugeMetricFamily]:
        now = datetime.now(UTC)
        counts = dict.fromkeys(Presence, 0)
        for device_id, (online, interval_s) in self._status.items():
            presence = self.silence.presence(
                online,
                self._heard.get(device_id),
                interval_s,
                now=now,
                hearing_since=self.hearing_since,
            )
            counts[presence] += 1
        yield GaugeMetricFamily(
            "edgefleet_devices_online",
            "Devices whose last status is online and that were heard from lately",
            value=counts[Presence.ONLINE],
        )
        yield GaugeMetricFamily(
            "edgefleet_devices_silent",
            "Devices whose last status is online but that have been silent for longer than their"
            " limit (presence_timeout_s, or three telemetry intervals)",
            value=counts[Presence.SILENT],
        )
        yield GaugeMetricFamily(
            "edgefleet_devices_known", "Devices that ever reported", value=len(self._status)
        )
        family = GaugeMetricFamily("edgefleet_rollouts", "Rollouts by state", labels=["state"])
        for state, n in sorted(self.rollout_states.items()):
            family.add_metric([state], n)
        yield family


class _StateCollector(Collector):
    def __init__(self, metrics: FleetMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return self._metrics.collect_state()
