# syntax=docker/dockerfile:1.7
# The edgefleet control plane: registry, rollouts, telemetry, REST API. linux/amd64, linux/arm64.
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -f packaging/containers/control-plane.Dockerfile -t edgefleet/control-plane .
# It validates uploaded models by loading them, so it carries ONNX Runtime and LiteRT too.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent agent
COPY common common
COPY runtimes runtimes
COPY control_plane control_plane
COPY hardware_profiles hardware_profiles
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/edgefleet/venv \
 && /opt/edgefleet/venv/bin/pip install "$(ls /wheels/edgefleet-*.whl)[control-plane,kubernetes]" \
 && /opt/edgefleet/venv/bin/pip uninstall --yes pip

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 edgefleet \
 && useradd --system --uid 10001 --gid edgefleet --home-dir /var/lib/edgefleet-cp \
      --shell /usr/sbin/nologin edgefleet \
 && install -d -o edgefleet -g edgefleet -m 0750 /var/lib/edgefleet-cp
COPY --from=build /opt/edgefleet/venv /opt/edgefleet/venv
# SQLite on the volume by default; set EDGEFLEET_CP_DB_URL to a PostgreSQL URL
# (postgresql+psycopg://...) to keep the database off the volume. Run one replica either way:
# there is no leader election and the MQTT client id is fixed (docs/kubernetes.md, Limits).
# Settings: docs/control-plane.md.
ENV PATH=/opt/edgefleet/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EDGEFLEET_CP_HOST=0.0.0.0 \
    EDGEFLEET_CP_PORT=8080 \
    EDGEFLEET_CP_STATE_DIR=/var/lib/edgefleet-cp \
    EDGEFLEET_CP_ARTIFACT_DIR=/var/lib/edgefleet-cp/artifacts \
    EDGEFLEET_CP_DB_URL=sqlite+aiosqlite:////var/lib/edgefleet-cp/edgefleet.db
USER 10001:10001
WORKDIR /var/lib/edgefleet-cp
EXPOSE 8080
VOLUME ["/var/lib/edgefleet-cp"]
# /health answers 503 while the database or the broker is unreachable.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('EDGEFLEET_CP_PORT', '8080'), timeout=4)"]
ENTRYPOINT ["edgefleet", "control-plane"]
