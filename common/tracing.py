"""OpenTelemetry's tracer provider as both programs build it (the ``tracing`` extra): the
settings section they share, and the SDK objects built from it, for what the settings leave
unset from OpenTelemetry's own OTEL_* variables (read by the SDK). Imported only where
``[tracing] enabled``: with tracing off neither program loads the SDK."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class TracingSettings(BaseModel):
    """OpenTelemetry request tracing (``[tracing]``; ``EDGEFLEET_AGENT_TRACING__*`` or
    ``EDGEFLEET_CP_TRACING__*``). What is left unset here comes from OpenTelemetry's standard
    variables (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``,
    ``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG``, ``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES``), read by the OpenTelemetry SDK itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = False
    """Export a span per request over OTLP/HTTP. Off by default, and then the SDK is not even
    imported."""
    endpoint: str | None = None
    """OTLP/HTTP traces URL (``http://127.0.0.1:4318/v1/traces``); unset: the OTEL_*
    variables, then the SDK's default (localhost:4318)."""
    sample_ratio: float | None = Field(default=None, ge=0.0, le=1.0)
    """Fraction of new traces recorded (a caller's sampled flag is followed); unset: the
    OTEL_TRACES_SAMPLER variables, then every trace."""
    service_name: str | None = None
    """``service.name`` of the spans, unless OTEL_SERVICE_NAME is set; unset: the program's
    own (``edgefleet-agent``, ``edgefleet-control-plane``)."""


def tracer_provider(settings: TracingSettings, default_name: str, id_generator: Any = None) -> Any:
    """The SDK's provider with a batch processor over the OTLP/HTTP exporter;
    ``id_generator``: the SDK's ``IdGenerator`` interface, default random ids."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    # the settings' name unless OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES say otherwise
    name = settings.service_name or default_name
    resource = Resource.create({"service.name": name}).merge(OTELResourceDetector().detect())
    sampler = None  # the SDK reads OTEL_TRACES_SAMPLER(_ARG); default parent-based, all
    if settings.sample_ratio is not None:
        sampler = ParentBased(TraceIdRatioBased(settings.sample_ratio))
    provider = TracerProvider(resource=resource, sampler=sampler, id_generator=id_generator)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.endpoint)))
    return provider
