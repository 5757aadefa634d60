# syntax=docker/dockerfile:1.7
# The edgefleet agent, CPU variant: ONNX Runtime and LiteRT. linux/amd64 and linux/arm64.
# Build from the repository root (docs/packaging.md):
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -f packaging/containers/agent-cpu.Dockerfile -t edgefleet/agent:cpu .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: the wheel, then a virtual environment with it and its dependencies ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# only what the wheel is built from (BuildKit sends only these paths of the context)
COPY pyproject.toml README.md ./
COPY agent agent
COPY common common
COPY runtimes runtimes
COPY control_plane control_plane
COPY hardware_profiles hardware_profiles
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/edgefleet/venv \
 && /opt/edgefleet/venv/bin/pip install /wheels/edgefleet-*.whl \
 && /opt/edgefleet/venv/bin/pip uninstall --yes pip

# ---- runtime: the slim base, the venv, a non-root user ----
FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 edgefleet \
 && useradd --system --uid 10001 --gid edgefleet --home-dir /var/lib/edgefleet \
      --shell /usr/sbin/nologin edgefleet \
 && install -d -o edgefleet -g edgefleet -m 0750 \
      /var/lib/edgefleet /var/lib/edgefleet/models /var/cache/edgefleet
COPY --from=build /opt/edgefleet/venv /opt/edgefleet/venv
# Settings as EDGEFLEET_AGENT_* variables (docs/agent.md); the fleet client stays off until
# EDGEFLEET_AGENT_FLEET__MQTT_URL is set.
ENV PATH=/opt/edgefleet/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EDGEFLEET_AGENT_HOST=0.0.0.0 \
    EDGEFLEET_AGENT_PORT=8000 \
    EDGEFLEET_AGENT_MODEL_REPOSITORY=/var/lib/edgefleet/models \
    EDGEFLEET_AGENT_RUNTIME__CACHE_DIR=/var/cache/edgefleet \
    EDGEFLEET_AGENT_FLEET__STATE_DIR=/var/lib/edgefleet/fleet
USER 10001:10001
WORKDIR /var/lib/edgefleet
EXPOSE 8000
VOLUME ["/var/lib/edgefleet", "/var/cache/edgefleet"]
# Liveness, from the image's own Python (no curl in a slim image). Readiness
# (/v2/health/ready) is for orchestrators' traffic decisions, not for restarts.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/live' % os.environ.get('EDGEFLEET_AGENT_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["edgefleet", "agent"]
