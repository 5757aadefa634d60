"""The OpenAI-compatible front end as the official ``openai`` client sees it, unmodified,
against a real agent: models, completions, chat, streaming equals whole, batched equals
alone, seeds, stop strings, and the documented errors."""

from __future__ import annotations

import asyncio
import random

import openai
import pytest

from tests.agent.openai.conftest import MODEL
from tests.agent.server import RunningAgent

WORDS = "the edge device serves models close to where the data is made".split()


def test_the_model_is_listed_and_retrieved(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]  # the batch model mlp is not generative
    assert models.data[0].owned_by == "edgefleet"
    assert client.models.retrieve(MODEL).id == MODEL


def test_a_completion_has_text_usage_and_finish_reason(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=MODEL, prompt="The edge device", max_tokens=12, temperature=0
    )
    choice = out.choices[0]
    assert out.object == "text_completion" and out.model == MODEL
    assert choice.finish_reason == "length" and choice.text.isprintable() and choice.text
    assert out.usage is not None and out.usage.completion_tokens == 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12


def test_a_chat_completion_answers_as_the_assistant(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "You summarise sensor logs."},
            {"role": "user", "content": "What happened overnight?"},
        ],
        max_tokens=20,
        temperature=0,
    )
    message = out.choices[0].message
    assert out.object == "chat.completion"
    assert message.role == "assistant" and message.content and message.content.isprintable()
    assert out.usage is not None and out.usage.completion_tokens == 20
    assert out.usage.prompt_tokens > 10  # the chat template's role markers count too


def test_a_chat_without_max_tokens_may_fill_the_context(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=0
    )
    assert out.usage is not None
    assert out.usage.total_tokens == 256 and out.choices[0].finish_reason == "length"


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_streaming_gives_the_same_text_and_usage_as_a_whole_answer(
    client: openai.OpenAI, kind: str
) -> None:
    args = {"model": MODEL, "max_tokens": 30, "temperature": 0}
    if kind == "chat":
        messages = [{"role": "user", "content": "Summarise the night."}]
        whole = client.chat.completions.create(messages=messages, **args)  # type: ignore[call-overload]
        stream = client.chat.completions.create(
            messages=messages, stream=True, stream_options={"include_usage": True}, **args
        )  # type: ignore[call-overload]
        expected = whole.choices[0].message.content
    else:
        whole = client.completions.create(prompt="A fleet of devices", **args)  # type: ignore[call-overload]
        stream = client.completions.create(
            prompt="A fleet of devices", stream=True, stream_options={"include_usage": True}, **args
        )  # type: ignore[call-overload]
        expected = whole.choices[0].text
    parts, finish, usage = [], None, None
    with stream:
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                parts.append((choice.delta.content or "") if kind == "chat" else choice.text)
                finish = choice.finish_reason or finish
    assert "".join(parts) == expected
    assert len([p for p in parts if p]) > 5  # chunks as they were decoded, not one at the end
    assert finish == "length" and usage == whole.usage


def test_the_same_seed_gives_the_same_text(client: openai.OpenAI) -> None:
    def sampled(seed: int) -> str:
        out = client.completions.create(
            model=MODEL,
            prompt="The operator",
            max_tokens=25,
            temperature=1.0,
            top_p=0.95,
            seed=seed,
        )
        return out.choices[0].text

    assert sampled(11) == sampled(11)
    assert sampled(11) != sampled(12)
    assert sampled(-3) == sampled(-3)  # OpenAI's seeds are any int64; numpy's are not


def test_a_stop_string_ends_the_answer_before_it(client: openai.OpenAI) -> None:
    full = (
        client.completions.create(
            model=MODEL, prompt="Sensors report", max_tokens=30, temperature=0
        )
        .choices[0]
        .text
    )
    stop = full[8:11]
    out = client.completions.create(
        model=MODEL,
        prompt="Sensors report",
        max_tokens=30,
        temperature=0,
        stop=[stop, "never-seen"],
    )
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].text == full[: full.index(stop)]


def test_sixteen_concurrent_requests_get_what_each_gets_alone(agent: RunningAgent) -> None:
    rng = random.Random(48)
    requests = [
        (" ".join(rng.choices(WORDS, k=rng.randint(1, 60))), rng.randint(1, 40)) for _ in range(16)
    ]

    async def run() -> tuple[list[str], list[str]]:
        async with openai.AsyncOpenAI(
            base_url=f"{agent.url}/v1", api_key="unused", max_retries=0
        ) as c:

            async def one(prompt: str, n: int) -> str:
                out = await c.completions.create(
                    model=MODEL, prompt=prompt, max_tokens=n, temperature=0
                )
                assert out.usage is not None and out.usage.completion_tokens == n
                return out.choices[0].text

            alone = [await one(p, n) for p, n in requests]
            steps = agent.state.generative.resolve(MODEL).engine.steps  # type: ignore[union-attr]
            together = await asyncio.gather(*(one(p, n) for p, n in requests))
            shared = agent.state.generative.resolve(MODEL).engine.steps - steps  # type: ignore[union-attr]
            # batched for real: far fewer steps than the requests' tokens and chunks
            assert shared < sum(n for _, n in requests) // 2
            return alone, list(together)

    alone, together = asyncio.run(run())
    assert together == alone


def test_an_unknown_model_is_404_naming_the_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="hi")
    assert e.value.body["param"] == "model" and e.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_a_batch_model_is_not_a_generative_one(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="mlp", messages=[{"role": "user", "content": "hi"}])


def test_over_the_context_window_is_400_context_length_exceeded(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="edge " * 200, max_tokens=100)
    body = e.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == "max_tokens"  # type: ignore[index]
    assert "256" in body["message"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 2}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"presence_penalty": 9}, "presence_penalty"),
        ({"seed": 2**63}, "seed"),
        ({"logprobs": 2}, "logprobs"),
        ({"echo": True}, "echo"),
        ({"prompt": [99999]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"stream_options": {"include_usage": "maybe"}}, "stream_options.include_usage"),
    ],
)
def test_bad_completion_parameters_are_400_naming_the_field(
    client: openai.OpenAI, extra: dict[str, object], param: str
) -> None:
    body = {"model": MODEL, "prompt": "hi", **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.post("/completions", body=body, cast_to=object)
    assert e.value.body["param"] == param, e.value.body  # type: ignore[index]
    assert e.value.body["type"] == "invalid_request_error"  # type: ignore[index]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user"}]}, "messages.0.content"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format.type"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_chat_parameters_are_400_naming_the_field(
    client: openai.OpenAI, extra: dict[str, object], param: str
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.post("/chat/completions", body=body, cast_to=object)
    assert e.value.body["param"] == param, e.value.body  # type: ignore[index]


def test_a_body_over_the_limit_is_413(agent: RunningAgent) -> None:
    answer = agent.client.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 300_000})
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "payload_too_large"


def test_a_body_that_is_not_json_is_400(agent: RunningAgent) -> None:
    answer = agent.client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "body"


def test_the_repository_index_lists_the_generative_model(agent: RunningAgent) -> None:
    rows = agent.client.post("/v2/repository/index", json={"ready": True}).json()
    assert {"name": MODEL, "version": "1", "state": "READY", "reason": ""} in rows
    assert any(r["name"] == "mlp" for r in rows)
