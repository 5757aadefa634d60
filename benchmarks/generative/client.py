"""Streams over an OpenAI ``/v1/completions`` endpoint (SSE), timed as a user sees them.

Raw ``httpx`` streaming rather than the ``openai`` client so the time of each chunk is the time
its bytes arrived, not the time a parser handed it over; the body is the OpenAI one both servers
take. A chunk carries one token on both servers (the agent may hold text back at a stop-string
boundary, never here, as no ``stop`` is sent); the token count is the final usage chunk's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx

LLAMACPP = "llamacpp"
"""The model name the llama.cpp server is asked for (it serves whatever it loaded)."""
SHORT_TOKENS = 4


async def stream_once(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    prompt: str,
    max_tokens: int,
    on_first: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """One streamed completion: its send time, each text chunk's arrival, the usage counts."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model == LLAMACPP:
        # its GGUF lacks the ONNX model's logit bias that keeps greedy text off end-of-text
        body["ignore_eos"] = True
    times: list[float] = []
    usage: dict[str, int] = {}
    sent = time.monotonic()
    async with client.stream("POST", f"{base}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{base}: {response.status_code} {await response.aread()!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if any(c.get("text") for c in chunk.get("choices", [])):
                times.append(time.monotonic())
                if len(times) == 1:
                    on_first()
    return {
        "sent": sent,
        "times": times,
        "tokens": int(usage.get("completion_tokens", len(times))),
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
    }


async def streams(
    base: str, model: str, prompt: str, count: int, max_tokens: int, timeout_s: float
) -> list[dict[str, Any]]:
    """``count`` streams started together."""
    limits = httpx.Limits(max_connections=count + 4)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        jobs = [stream_once(client, base, model, prompt, max_tokens) for _ in range(count)]
        return list(await asyncio.wait_for(asyncio.gather(*jobs), timeout_s))


async def short_under_load(
    base: str, model: str, prompt: str, long_streams: int, long_tokens: int, timeout_s: float
) -> tuple[float, float]:
    """TTFT in seconds of a short request alone, then while ``long_streams`` long ones decode
    (sent once every long one has had its first token)."""
    limits = httpx.Limits(max_connections=long_streams + 4)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        alone = await stream_once(client, base, model, prompt, SHORT_TOKENS)
        started = asyncio.Event()
        firsts = [0]

        def mark() -> None:
            firsts[0] += 1
            if firsts[0] == long_streams:
                started.set()

        tasks = [
            asyncio.create_task(stream_once(client, base, model, prompt, long_tokens, mark))
            for _ in range(long_streams)
        ]
        try:
            await asyncio.wait_for(started.wait(), timeout_s)
            loaded = await stream_once(client, base, model, prompt, SHORT_TOKENS)
            await asyncio.wait_for(asyncio.gather(*tasks), timeout_s)
        finally:
            for task in tasks:
                task.cancel()
    return alone["times"][0] - alone["sent"], loaded["times"][0] - loaded["sent"]
