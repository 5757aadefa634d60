"""A real agent for pipeline tests, with the ``pipelines`` settings in effect."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from agent.main import bind_socket, build_state, server_config
from agent.settings import AgentSettings
from tests.agent.server import RunningAgent, wait_until


@contextlib.contextmanager
def serve_pipelines(repository: Path, **settings: Any) -> Iterator[RunningAgent]:
    """As :func:`tests.agent.server.serve`, giving the manager the ``pipelines`` settings
    (NOTE: until ``agent/main.py`` passes ``settings.pipelines`` to the manager itself)."""
    settings.setdefault("port", 0)
    config = AgentSettings(model_repository=repository, **settings)
    state = build_state(config)
    state.manager.pipelines = config.pipelines
    sock = bind_socket(config)
    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(server_config(config, state))
    server.config.loop = "asyncio"
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://{host}:{port}"
    client = httpx.Client(base_url=url, timeout=60)
    try:
        wait_until(lambda: server.started, what="uvicorn to start")
        wait_until(lambda: state.loaded, what="the start-up load")
        yield RunningAgent(url, state, client)
    finally:
        client.close()
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
        if thread.is_alive():
            raise AssertionError("the agent did not stop within 60 s")
