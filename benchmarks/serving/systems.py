"""The systems under comparison, each started as its own process on 127.0.0.1.

- ``agent``: ``edgefleet agent`` with dynamic batching (the model's default config);
- ``agent-nobatch``: the same with ``max_batch_size = 0``;
- ``fastapi``: :mod:`benchmarks.serving.plain_endpoint`, ONNX Runtime per request;
- ``fastapi-async``: its async flavour, orjson and the session run on uvloop's event loop;
- ``lean``: :mod:`benchmarks.serving.lean_server`, the leanest Python server of the V2 infer route,
  as a measure of what any Python server pays here (binary bodies);
- ``mlserver``: MLServer 1.7 with :mod:`benchmarks.serving.mlserver_runtime` and adaptive
  batching, in its own virtual environment made on first use (``uvloop==0.21.0`` pinned: with
  0.23 its inference workers die at start, SeldonIO/MLServer#2286).

Every system gets the same model file and the same ONNX Runtime thread defaults.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

MLSERVER_VERSION = "1.7.1"
MLSERVER_PINS = (f"mlserver=={MLSERVER_VERSION}", "uvloop==0.21.0", "onnxruntime", "numpy")
DEFAULT_MLSERVER_VENV = Path.home() / ".cache" / "edgefleet" / f"bench-mlserver-{MLSERVER_VERSION}"
SYSTEMS = ("agent", "agent-nobatch", "fastapi", "lean", "mlserver")


@dataclass
class Running:
    name: str
    base_url: str
    process: psutil.Process
    started_s: float
    """Seconds from spawning the process to its first successful inference."""
    batch_log: Path | None = None
    """MLServer only: one line per batch with its row count."""
    extra: dict[str, str] = field(default_factory=dict)

    def infer_url(self, model: str) -> str:
        return f"{self.base_url}/v2/models/{model}/infer"

    def tree_rss_bytes(self) -> int:
        """Resident memory of the server and its worker processes."""
        procs = [self.process, *self.process.children(recursive=True)]
        return sum(p.memory_info().rss for p in procs if p.is_running())

    def tree_cpu_s(self) -> float:
        total = 0.0
        for p in [self.process, *self.process.children(recursive=True)]:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
        return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _first_inference(
    url: str, body: bytes, proc: subprocess.Popen[bytes], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=10) as client:
        while True:
            try:
                r = client.post(url, content=body, headers={"Content-Type": "application/json"})
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"{url}: the server exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}: no successful inference within {timeout_s} s")
            time.sleep(0.02)


@contextmanager
def server_process(
    name: str,
    args: list[str],
    env: dict[str, str],
    port: int,
    model: str,
    probe_body: bytes,
    log_path: Path,
    cwd: Path | None = None,
) -> Iterator[Running]:
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
    base = f"http://127.0.0.1:{port}"
    try:
        _first_inference(f"{base}/v2/models/{model}/infer", probe_body, proc, timeout_s=180)
        yield Running(name, base, psutil.Process(proc.pid), time.monotonic() - started)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def quiet_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


def agent(
    repository: Path,
    model: str,
    probe_body: bytes,
    logs: Path,
    *,
    batching: bool = True,
    cache_dir: Path | None = None,
    config: str = "",
    env: Mapping[str, str] | None = None,
    name: str = "",
) -> AbstractContextManager[Running]:
    """``repository`` holds only ``model``; ``config`` is its config.toml's top-level settings
    (none by default); with ``batching=False`` its config turns batching off; ``cache_dir`` is
    the compiled-model cache (none by default); ``env`` is added to the process's environment;
    ``name`` names the system (by default ``agent`` or ``agent-nobatch``)."""
    if config or not batching:
        text = config + ("" if batching else "[batching]\nmax_batch_size = 0\n")
        (repository / model / "config.toml").write_text(text)
    port = free_port()
    exe = Path(sys.executable).parent / "edgefleet"
    environment = quiet_env(
        EDGEFLEET_AGENT_ACCESS_LOG="false", EDGEFLEET_AGENT_LOG_LEVEL="WARNING", **(env or {})
    )
    if cache_dir is not None:
        environment["EDGEFLEET_AGENT_RUNTIME__CACHE_DIR"] = str(cache_dir)
    args = [str(exe), "agent", "--model-repository", str(repository), "--port", str(port)]
    name = name or ("agent" if batching else "agent-nobatch")
    return server_process(name, args, environment, port, model, probe_body, logs / f"{name}.log")


def fastapi_endpoint(
    model_file: Path | list[Path],
    model: str,
    probe_body: bytes,
    logs: Path,
    *,
    fast: bool = False,
) -> AbstractContextManager[Running]:
    """The plain endpoint serving ``model_file`` (or several, each under its model's name);
    ``fast``: the async orjson flavour on uvloop and httptools (``fastapi-async``)."""
    port = free_port()
    files = model_file if isinstance(model_file, list) else [model_file]
    name = "fastapi-async" if fast else "fastapi"
    app = "async_app" if fast else "app"
    args = [
        sys.executable,
        "-m",
        "uvicorn",
        f"benchmarks.serving.plain_endpoint:{app}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-access-log",
        "--log-level",
        "warning",
        *(["--loop", "uvloop", "--http", "httptools"] if fast else []),
    ]
    env = quiet_env(EDGEFLEET_BENCH_MODEL=os.pathsep.join(str(f) for f in files))
    return server_process(name, args, env, port, model, probe_body, logs / f"{name}.log")


def lean_server(
    model_file: Path, model: str, probe_body: bytes, logs: Path, *, instances: int = 1
) -> AbstractContextManager[Running]:
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "benchmarks.serving.lean_server",
        "--model-file",
        str(model_file),
        "--port",
        str(port),
        "--instances",
        str(instances),
    ]
    return server_process("lean", args, quiet_env(), port, model, probe_body, logs / "lean.log")


def ensure_mlserver_venv(venv: Path = DEFAULT_MLSERVER_VENV) -> Path:
    """The MLServer virtual environment, made with pip on first use; returns its ``mlserver``."""
    exe = venv / "bin" / "mlserver"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", *MLSERVER_PINS],
            check=True,
            timeout=1800,
        )
    return exe


@contextmanager
def mlserver(
    model_file: Path,
    model: str,
    probe_body: bytes,
    logs: Path,
    workdir: Path,
    *,
    max_batch_size: int = 32,
    max_batch_time_s: float = 0.002,
    venv: Path = DEFAULT_MLSERVER_VENV,
) -> Iterator[Running]:
    exe = ensure_mlserver_venv(venv)
    root = workdir / "mlserver"
    shutil.rmtree(root, ignore_errors=True)
    model_dir = root / model
    model_dir.mkdir(parents=True)
    shutil.copy(model_file, model_dir / "model.onnx")
    shutil.copy(Path(__file__).with_name("mlserver_runtime.py"), root / "mlserver_runtime.py")
    port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    settings = {
        "host": "127.0.0.1",
        "http_port": port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
        "debug": False,
    }
    (root / "settings.json").write_text(json.dumps(settings))
    model_settings = {
        "name": model,
        "implementation": "mlserver_runtime.OnnxRuntime",
        "max_batch_size": max_batch_size,
        "max_batch_time": max_batch_time_s,
        "parameters": {"uri": "./model.onnx"},
    }
    (model_dir / "model-settings.json").write_text(json.dumps(model_settings))
    batch_log = root / "batches.log"
    env = quiet_env(EDGEFLEET_BENCH_BATCH_LOG=str(batch_log), PYTHONPATH=str(root))
    env.pop("VIRTUAL_ENV", None)
    with server_process(
        "mlserver",
        [str(exe), "start", str(root)],
        env,
        port,
        model,
        probe_body,
        logs / "mlserver.log",
        cwd=root,
    ) as running:
        running.batch_log = batch_log
        yield running
