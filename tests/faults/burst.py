"""An inference burst on 127.0.0.1 from a background thread (httpx on asyncio, many requests in
flight), keeping every answer, so a test can kill the agent in the middle of it."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from dataclasses import dataclass, field

import httpx

BODY = {"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": [0.0] * 256}]}


@dataclass
class Burst:
    address: str
    concurrency: int = 16
    codes: Counter[int] = field(default_factory=Counter)
    versions: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    """Transport errors (the connection refused or reset once the agent is gone)."""

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    @property
    def answered(self) -> int:
        return sum(self.codes.values())

    async def _worker(self, client: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            try:
                resp = await client.post("/v2/models/mlp/infer", json=BODY)
            except httpx.HTTPError as exc:
                self.errors.append(type(exc).__name__)
                await asyncio.sleep(0.01)  # the agent is gone: do not spin
                continue
            self.codes[resp.status_code] += 1
            if resp.status_code == 200:
                self.versions[str(resp.json()["model_version"])] += 1

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.concurrency)
        async with httpx.AsyncClient(base_url=self.address, timeout=30, limits=limits) as client:
            await asyncio.gather(*(self._worker(client) for _ in range(self.concurrency)))

    def start(self) -> Burst:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
