"""A real agent on 127.0.0.1, served by uvicorn in a thread (as httpx's own tests do)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from agent.inference.versions import RuntimeFactory
from agent.main import bind_socket, build_state, server_config
from agent.serving.state import ServingState
from agent.settings import AgentSettings
from runtimes.backends import open_model


@dataclass
class RunningAgent:
    url: str
    state: ServingState
    client: httpx.Client

    def infer_json(self, model: str, rows: Any, **extra: Any) -> httpx.Response:
        import numpy as np

        array = np.asarray(rows, dtype=np.float32)
        tensor = {
            "name": "input",
            "shape": list(array.shape),
            "datatype": "FP32",
            "data": array.ravel().tolist(),
        }
        body = {"inputs": [tensor], **extra}
        return self.client.post(f"/v2/models/{model}/infer", json=body)


def wait_until(predicate: Any, timeout_s: float = 30.0, what: str = "condition") -> None:
    """Poll a readiness condition (an HTTP probe, a counter) until it holds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.01)


@contextlib.contextmanager
def serve(
    repository: Path,
    *,
    runtime_factory: RuntimeFactory = open_model,
    wait_ready: bool = True,
    **settings: Any,
) -> Iterator[RunningAgent]:
    settings.setdefault("port", 0)
    config = AgentSettings(model_repository=repository, **settings)
    state = build_state(config, runtime_factory=runtime_factory)
    config = state.settings  # with the fleet's config twin over them, as the agent serves
    sock = bind_socket(config)
    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(server_config(config, state))
    server.config.loop = "asyncio"  # uvloop in a non-main thread is fine too; asyncio is simpler
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://{host}:{port}"
    client = httpx.Client(base_url=url, timeout=60)
    try:
        wait_until(lambda: server.started, what="uvicorn to start")
        if wait_ready:
            wait_until(lambda: state.loaded, what="the start-up load")
        yield RunningAgent(url, state, client)
    finally:
        client.close()
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
        if thread.is_alive():
            # name what it waits on: a test waiting for its effects would only time out
            raise AssertionError(f"the agent did not stop within 60 s:\n{_stuck(thread)}")


def _stuck(thread: threading.Thread) -> str:
    """A stuck server thread's stack and its event loop's pending tasks."""
    frame = sys._current_frames().get(thread.ident or 0)
    if frame is None:
        return "(the thread has no frame)"
    parts = ["".join(traceback.format_stack(frame))]
    while frame is not None:
        loop = frame.f_locals.get("self")
        if isinstance(loop, asyncio.AbstractEventLoop):
            for task in asyncio.all_tasks(loop):
                out = io.StringIO()
                task.print_stack(file=out)
                parts.append(out.getvalue())
            break
        frame = frame.f_back
    return "\n".join(parts)


def copy_models(
    source: Path, target: Path, *names: str, configs: dict[str, str] | None = None
) -> Path:
    """A private repository with some example models and, optionally, their config.toml."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(source / name, target / name)
    for name, text in (configs or {}).items():
        (target / name / "config.toml").write_text(text)
    return target
