# syntax=docker/dockerfile:1.7
# The edgefleet agent, NVIDIA Jetson variant (Orin, JetPack 6): ONNX Runtime with the CUDA and
# TensorRT execution providers, on an L4T base. linux/arm64 only.
#   docker buildx build --platform linux/arm64 \
#     --build-context ort-wheels=./ort-wheels \
#     -f packaging/containers/agent-jetson.Dockerfile -t edgefleet/agent:jetson .
# Run with the NVIDIA container runtime: docker run --runtime nvidia ...
#
# ONNX Runtime GPU for Jetson is not on PyPI. The ort-wheels stage below builds it from source
# for this image's CUDA, cuDNN and TensorRT (ONNX Runtime's documented Jetson build: about two
# hours on an AGX Orin, far longer under emulation). Pass a directory holding an
# onnxruntime_gpu-*-cp311-*-linux_aarch64.whl as the ort-wheels build context to skip it
# (a wheel from a previous build, or from NVIDIA's Jetson AI Lab index for this JetPack).
ARG L4T_IMAGE=nvcr.io/nvidia/l4t-jetpack:r36.4.0
ARG ORT_VERSION=v1.20.1

# ---- Python 3.11: JetPack 6 is Ubuntu 22.04, whose python3 is 3.10 ----
FROM ${L4T_IMAGE} AS python
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install --yes --no-install-recommends software-properties-common gpg-agent \
 && add-apt-repository --yes ppa:deadsnakes/ppa \
 && apt-get install --yes --no-install-recommends python3.11 python3.11-venv \
 && apt-get purge --yes --auto-remove software-properties-common gpg-agent \
 && rm -rf /var/lib/apt/lists/*

# ---- ONNX Runtime GPU (CUDA + TensorRT execution providers), built from source ----
FROM python AS ort-build
ARG ORT_VERSION
RUN apt-get update \
 && apt-get install --yes --no-install-recommends git build-essential python3.11-dev \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/ort-build \
 && /opt/ort-build/bin/pip install cmake ninja numpy packaging wheel setuptools \
 && git clone --depth 1 --branch "${ORT_VERSION}" --recursive \
      https://github.com/microsoft/onnxruntime /src/onnxruntime
WORKDIR /src/onnxruntime
# sm_87: the Orin GPU
RUN PATH=/opt/ort-build/bin:$PATH ./build.sh --config Release --update --build --parallel \
      --build_wheel --skip_tests --allow_running_as_root \
      --use_cuda --cuda_home /usr/local/cuda --cudnn_home /usr/lib/aarch64-linux-gnu \
      --use_tensorrt --tensorrt_home /usr/lib/aarch64-linux-gnu \
      --cmake_extra_defines CMAKE_CUDA_ARCHITECTURES=87 onnxruntime_BUILD_UNIT_TESTS=OFF \
 && mkdir /out && cp build/Linux/Release/dist/onnxruntime_gpu-*.whl /out/

FROM scratch AS ort-wheels
COPY --from=ort-build /out/ /

# ---- build: edgefleet and its dependencies, with the GPU build of ONNX Runtime ----
FROM python AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent agent
COPY common common
COPY runtimes runtimes
COPY control_plane control_plane
COPY hardware_profiles hardware_profiles
COPY --from=ort-wheels / /ort-wheels/
# onnxruntime-gpu provides the onnxruntime module; the CPU build from PyPI (which edgefleet
# requires by name) is removed after the install so that only the GPU one remains.
RUN --mount=type=cache,target=/root/.cache/pip \
    python3.11 -m venv /opt/edgefleet/venv \
 && /opt/edgefleet/venv/bin/pip install build \
 && /opt/edgefleet/venv/bin/python -m build --wheel --outdir /wheels . \
 && /opt/edgefleet/venv/bin/pip install /wheels/edgefleet-*.whl \
 && /opt/edgefleet/venv/bin/pip uninstall --yes onnxruntime build pyproject_hooks \
 && /opt/edgefleet/venv/bin/pip install --no-deps /ort-wheels/onnxruntime_gpu-*.whl \
 && /opt/edgefleet/venv/bin/python -c "import onnxruntime as o; p = o.get_available_providers(); assert 'CUDAExecutionProvider' in p, p" \
 && /opt/edgefleet/venv/bin/pip uninstall --yes pip

# ---- runtime: L4T with CUDA, cuDNN and TensorRT (the execution providers load them) ----
FROM python
RUN groupadd --system --gid 10001 edgefleet \
 && useradd --system --uid 10001 --gid edgefleet --groups video \
      --home-dir /var/lib/edgefleet --shell /usr/sbin/nologin edgefleet \
 && install -d -o edgefleet -g edgefleet -m 0750 \
      /var/lib/edgefleet /var/lib/edgefleet/models /var/cache/edgefleet
COPY --from=build /opt/edgefleet/venv /opt/edgefleet/venv
ENV PATH=/opt/edgefleet/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EDGEFLEET_AGENT_HOST=0.0.0.0 \
    EDGEFLEET_AGENT_PORT=8000 \
    EDGEFLEET_AGENT_PROFILE=auto \
    EDGEFLEET_AGENT_MODEL_REPOSITORY=/var/lib/edgefleet/models \
    EDGEFLEET_AGENT_RUNTIME__CACHE_DIR=/var/cache/edgefleet \
    EDGEFLEET_AGENT_FLEET__STATE_DIR=/var/lib/edgefleet/fleet
USER 10001:10001
WORKDIR /var/lib/edgefleet
EXPOSE 8000
# TensorRT engines are cached here: keep it on a volume so a restart skips the build.
VOLUME ["/var/lib/edgefleet", "/var/cache/edgefleet"]
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/live' % os.environ.get('EDGEFLEET_AGENT_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["edgefleet", "agent"]
