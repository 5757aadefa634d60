# syntax=docker/dockerfile:1.7
# The edgefleet agent, Intel variant: OpenVINO (CPU, integrated GPU, NPU) besides ONNX Runtime
# and LiteRT. linux/amd64 (Intel GPUs and NPUs are x86 parts).
#   docker buildx build --platform linux/amd64 \
#     -f packaging/containers/agent-intel.Dockerfile -t edgefleet/agent:intel .
# Drivers: Debian's OpenCL runtime for the integrated GPU is installed; for the NPU, and for
# GPUs newer than Debian's runtime (Core Ultra, Arc), put Intel's driver packages in
# packaging/containers/intel-drivers/ before building (its README lists them). Without them
# the image serves on CPU (and the older GPUs) and reports the NPU as absent.
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
 && /opt/edgefleet/venv/bin/pip install "$(ls /wheels/edgefleet-*.whl)[openvino]" \
 && /opt/edgefleet/venv/bin/pip uninstall --yes pip

FROM ${PYTHON_IMAGE}
# The integrated GPU through OpenCL (Intel's compute runtime from Debian); newer GPU and NPU
# drivers from the optional local directory.
RUN --mount=type=bind,source=packaging/containers/intel-drivers,target=/tmp/intel-drivers \
    apt-get update \
 && apt-get install --yes --no-install-recommends intel-opencl-icd ocl-icd-libopencl1 \
 && if ls /tmp/intel-drivers/*.deb >/dev/null 2>&1; then \
        apt-get install --yes --no-install-recommends /tmp/intel-drivers/*.deb; \
    fi \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 edgefleet \
 && useradd --system --uid 10001 --gid edgefleet --home-dir /var/lib/edgefleet \
      --shell /usr/sbin/nologin edgefleet \
 && install -d -o edgefleet -g edgefleet -m 0750 \
      /var/lib/edgefleet /var/lib/edgefleet/models /var/cache/edgefleet
COPY --from=build /opt/edgefleet/venv /opt/edgefleet/venv
ENV PATH=/opt/edgefleet/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EDGEFLEET_AGENT_HOST=0.0.0.0 \
    EDGEFLEET_AGENT_PORT=8000 \
    EDGEFLEET_AGENT_MODEL_REPOSITORY=/var/lib/edgefleet/models \
    EDGEFLEET_AGENT_RUNTIME__CACHE_DIR=/var/cache/edgefleet \
    EDGEFLEET_AGENT_FLEET__STATE_DIR=/var/lib/edgefleet/fleet
# /dev/dri/renderD* and /dev/accel/accel* belong to the host's render group: run with
#   --device /dev/dri --device /dev/accel --group-add "$(stat -c %g /dev/dri/renderD128)"
USER 10001:10001
WORKDIR /var/lib/edgefleet
EXPOSE 8000
VOLUME ["/var/lib/edgefleet", "/var/cache/edgefleet"]
# OpenVINO compiles models for the GPU and NPU on first start: a longer start period.
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/live' % os.environ.get('EDGEFLEET_AGENT_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["edgefleet", "agent"]
