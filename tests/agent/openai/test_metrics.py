"""The metrics a generative server is judged by, as a Prometheus scrape shows them."""

from __future__ import annotations

import asyncio

import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.agent.openai.conftest import MODEL
from tests.agent.server import RunningAgent

LABELS = {"model": MODEL, "version": "1"}


def scrape(agent: RunningAgent) -> dict[str, float]:
    """Every sample of the generative families with our labels, by sample name (histogram
    buckets left out)."""
    out = {}
    for family in text_string_to_metric_families(agent.client.get("/metrics").text):
        if family.name.startswith("edgefleet_generative"):
            for s in family.samples:
                if s.labels == LABELS:
                    out[s.name] = s.value
    return out


def test_tokens_latencies_and_state_are_counted(agent: RunningAgent) -> None:
    before = scrape(agent)

    async def five() -> list[openai.types.Completion]:
        async with openai.AsyncOpenAI(base_url=f"{agent.url}/v1", api_key="x", max_retries=0) as c:
            return list(
                await asyncio.gather(
                    *(
                        c.completions.create(
                            model=MODEL, prompt="edge " * (i + 1), max_tokens=5 + i
                        )
                        for i in range(5)
                    )
                )
            )

    answers = asyncio.run(five())
    after = scrape(agent)

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    usages = [a.usage for a in answers if a.usage is not None]
    assert grew("edgefleet_generative_prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert grew("edgefleet_generative_generation_tokens_total") == sum(
        u.completion_tokens for u in usages
    )
    assert grew("edgefleet_generative_time_to_first_token_seconds_count") == 5
    assert grew("edgefleet_generative_e2e_request_latency_seconds_count") == 5
    assert grew("edgefleet_generative_inter_token_latency_seconds_count") == sum(
        u.completion_tokens - 1 for u in usages
    )
    assert grew("edgefleet_generative_time_to_first_token_seconds_sum") > 0
    assert after["edgefleet_generative_running_sequences"] == 0
    assert after["edgefleet_generative_waiting_sequences"] == 0
    assert after["edgefleet_generative_kv_cache_usage_ratio"] == 0
    assert after["edgefleet_generative_kv_cache_budget_tokens"] == 16 * 256
    for name in ("deferred", "refused", "cancelled"):
        assert f"edgefleet_generative_sequences_{name}_total" in after
