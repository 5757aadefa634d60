"""Server-sent events as raw HTTP (httpx) sees them, and streams under load: the wire format,
a late short request served before long ones finish, clients that drop mid-stream leaving
nothing behind, and 64 concurrent streams that each complete or are refused with
Retry-After while the agent stays up."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.openai.conftest import MODEL
from tests.agent.server import RunningAgent, serve, wait_until


def events(lines: Iterator[str]) -> Iterator[str]:
    """The ``data:`` payloads of an SSE body, checking each event is one line and a blank."""
    pending = None
    for line in lines:
        if pending is None:
            assert line.startswith("data: "), line
            pending = line[len("data: ") :]
        else:
            assert line == "", f"an event is one data line then a blank one: {line!r}"
            yield pending
            pending = None
    assert pending is None


def test_the_chat_stream_on_the_wire(agent: RunningAgent) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with agent.client.stream("POST", "/v1/chat/completions", json=body) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert answer.headers["cache-control"] == "no-cache"
        payloads = list(events(answer.iter_lines()))
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    assert all(c["usage"] is None for c in chunks[:-1])


def test_without_include_usage_there_is_no_usage_chunk(agent: RunningAgent) -> None:
    body = {"model": MODEL, "prompt": "edge", "max_tokens": 5, "temperature": 0, "stream": True}
    with agent.client.stream("POST", "/v1/completions", json=body) as answer:
        payloads = list(events(answer.iter_lines()))
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all("usage" not in c and c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def _stream(
    url: str,
    prompt: str,
    max_tokens: int,
    log: list[tuple[str, str]],
    name: str,
    lock: threading.Lock,
) -> None:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    with (
        httpx.Client(base_url=url, timeout=60) as client,
        client.stream("POST", "/v1/completions", json=body) as answer,
    ):
        assert answer.status_code == 200
        first = True
        for payload in events(answer.iter_lines()):
            if payload == "[DONE]":
                with lock:
                    log.append((name, "done"))
            elif first and json.loads(payload)["choices"][0]["text"]:
                first = False
                with lock:
                    log.append((name, "first"))


def test_a_late_short_request_gets_its_first_token_before_long_ones_finish(
    agent: RunningAgent,
) -> None:
    log: list[tuple[str, str]] = []
    lock = threading.Lock()
    longs = [
        threading.Thread(target=_stream, args=(agent.url, f"long {i}", 240, log, f"long{i}", lock))
        for i in range(4)
    ]
    for t in longs:
        t.start()
    wait_until(lambda: sum(1 for _, e in log if e == "first") == 4, what="the long streams")
    # a long prompt too: prefilled in chunks between the long streams' decode steps
    short = threading.Thread(target=_stream, args=(agent.url, "edge " * 100, 3, log, "short", lock))
    short.start()
    for t in [short, *longs]:
        t.join(timeout=120)
    order = [f"{n}:{e}" for n, e in log]
    assert order.index("short:first") < min(order.index(f"long{i}:done") for i in range(4)), order
    assert order.index("short:done") < min(order.index(f"long{i}:done") for i in range(4)), order


def scheduler_of(agent: RunningAgent) -> Any:
    assert agent.state.generative is not None
    return agent.state.generative.resolve(MODEL).engine.scheduler


def metric(agent: RunningAgent, name: str) -> float:
    for line in agent.client.get("/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def test_fifty_clients_that_drop_mid_stream_leave_nothing_behind(agent: RunningAgent) -> None:
    scheduler = scheduler_of(agent)
    cancelled = scheduler.counts.cancelled

    async def drop(n: int) -> None:
        body = {"model": MODEL, "prompt": f"stream {n}", "max_tokens": 200, "stream": True}
        async with httpx.AsyncClient(base_url=agent.url, timeout=60) as client:
            async with client.stream("POST", "/v1/completions", json=body) as answer:
                assert answer.status_code == 200
                lines = answer.aiter_lines()
                for _ in range(4):  # the role-less first chunk, then a token's
                    await anext(lines)
            # leaving the block closes the connection mid-stream

    async def all_of_them() -> None:
        await asyncio.gather(*(drop(n) for n in range(50)))

    asyncio.run(all_of_them())
    wait_until(lambda: scheduler.running == 0 and scheduler.waiting == 0, what="slots freed")
    assert scheduler.kv_reserved_tokens == 0
    assert scheduler.counts.cancelled - cancelled == 50  # none ran on to 200 tokens
    engine = agent.state.generative.resolve(MODEL).engine  # type: ignore[union-attr]
    assert engine.in_flight == 0
    assert metric(agent, "edgefleet_generative_running_sequences") == 0
    assert metric(agent, "edgefleet_generative_kv_cache_usage_ratio") == 0
    again = agent.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "edge", "max_tokens": 3}
    )
    assert again.status_code == 200


@pytest.fixture(scope="module")
def small_agent(lm_repository: Path) -> Iterator[RunningAgent]:
    """Room for 4 sequences and 8 waiting: most of 64 streams at once are refused."""
    with serve(
        lm_repository,
        max_concurrent_requests=48,
        generative={"max_sequences": 4, "max_waiting_sequences": 8, "kv_cache_tokens": 1024},
    ) as running:
        yield running


def test_sixty_four_streams_complete_or_are_refused_with_retry_after(
    small_agent: RunningAgent,
) -> None:
    async def one(client: httpx.AsyncClient, n: int) -> tuple[int, str]:
        body = {
            "model": MODEL,
            "prompt": f"load {n}",
            "max_tokens": 30,
            "stream": True,
            "temperature": 0,
        }
        async with client.stream("POST", "/v1/completions", json=body) as answer:
            if answer.status_code != 200:
                assert answer.status_code in (429, 503), answer.status_code
                assert int(answer.headers["retry-after"]) >= 1
                return answer.status_code, ""
            payloads = [p async for p in _aevents(answer.aiter_lines())]
            assert payloads[-1] == "[DONE]"
            assert json.loads(payloads[-2])["choices"][0]["finish_reason"] == "length"
            return 200, "".join(json.loads(p)["choices"][0]["text"] for p in payloads[:-1])

    async def sixty_four() -> list[tuple[int, str]]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(
            base_url=small_agent.url, timeout=120, limits=limits
        ) as client:
            return list(await asyncio.gather(*(one(client, n) for n in range(64))))

    results = asyncio.run(sixty_four())
    statuses = [s for s, _ in results]
    assert statuses.count(200) >= 4 + 8 and statuses.count(429) + statuses.count(503) > 0
    assert all(text for s, text in results if s == 200)
    assert small_agent.client.get("/v2/health/ready").status_code == 200
    scheduler = scheduler_of(small_agent)
    assert scheduler.running == 0 and scheduler.kv_reserved_tokens == 0
    assert metric(small_agent, "edgefleet_generative_sequences_refused_total") == statuses.count(
        429
    )
    after = small_agent.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "edge", "max_tokens": 3}
    )
    assert after.status_code == 200


async def _aevents(lines: Any) -> Any:
    pending = None
    async for line in lines:
        if pending is None:
            pending = line.removeprefix("data: ")
        else:
            assert line == ""
            yield pending
            pending = None
