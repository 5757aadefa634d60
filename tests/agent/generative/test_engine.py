"""The token loop on the real ``tiny-lm`` in ONNX Runtime: greedy output is the same alone and
batched with any others, seeded sampling repeats, stop strings and max_tokens end a sequence,
and a cancelled sequence leaves nothing behind."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.generative.decoder import Decoder
from agent.generative.sampling import SamplingParams
from agent.generative.streams import FinishReason, Generation
from tests.agent.generative.conftest import Loaded, generate

WORDS = ("edge", "fleet", "model", "device", "token", "stream", "The", "a", "sensor", "operator")

prompts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=40).map(" ".join)
requests = st.lists(st.tuples(prompts, st.integers(1, 24)), min_size=2, max_size=10)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(requests, st.integers(0, 3))
def test_greedy_output_is_the_same_alone_and_batched(
    lm: Loaded, batch: list[tuple[str, int]], late: int
) -> None:
    engine = lm.engine
    alone = [lm.run(generate(engine, p, greedy(n))) for p, n in batch]

    async def together() -> list[tuple[str, FinishReason | None, int]]:
        first = [asyncio.ensure_future(generate(engine, p, greedy(n))) for p, n in batch[late:]]
        for _ in range(late):  # the rest join while the first decode
            await asyncio.sleep(0)
        rest = [asyncio.ensure_future(generate(engine, p, greedy(n))) for p, n in batch[:late]]
        return list(await asyncio.gather(*rest, *first))

    batched = lm.run(together())
    assert batched == alone
    for (text, finish, tokens), (_, n) in zip(alone, batch, strict=True):
        assert finish is FinishReason.LENGTH and tokens == n
        assert text.isprintable() and text


def test_steps_are_shared_by_the_sequences_running(lm: Loaded) -> None:
    engine = lm.engine
    before = engine.steps

    async def eight() -> None:
        await asyncio.gather(*(generate(engine, "edge fleet", greedy(20)) for _ in range(8)))

    lm.run(eight())
    # 8 sequences of 20 tokens: one prefill step each at most, then shared decode steps
    assert engine.steps - before < 8 + 20 + 8


def test_the_same_seed_gives_the_same_text_and_another_seed_another(lm: Loaded) -> None:
    engine = lm.engine

    def sampled(seed: int) -> str:
        params = SamplingParams(max_tokens=30, temperature=1.2, top_p=0.9, top_k=50, seed=seed)
        return str(lm.run(generate(engine, "The device", params))[0])

    assert sampled(7) == sampled(7)
    assert sampled(7) != sampled(8)


def test_a_stop_string_ends_the_text_before_it(lm: Loaded) -> None:
    engine = lm.engine
    full, _, _ = lm.run(generate(engine, "a sensor", greedy(40)))
    stop = full[10:13]
    text, finish, _ = lm.run(
        generate(engine, "a sensor", SamplingParams(max_tokens=40, temperature=0.0, stop=(stop,)))
    )
    assert finish is FinishReason.STOP
    assert text == full[: full.index(stop)]


def test_penalties_change_greedy_text(lm: Loaded) -> None:
    engine = lm.engine
    plain = lm.run(generate(engine, "token", greedy(40)))[0]
    penalised = SamplingParams(
        max_tokens=40, temperature=0.0, frequency_penalty=2.0, presence_penalty=1.0
    )
    assert lm.run(generate(engine, "token", penalised))[0] != plain


def test_a_cancelled_sequence_frees_its_slot_and_tokens_within_a_step(lm: Loaded) -> None:
    engine = lm.engine

    async def cancel_mid_stream() -> int:
        stream = engine.submit(Generation(engine.codec.encode("edge " * 30), greedy(200)))
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 3:
                stream.cancel()
                break
        return seen

    steps = engine.steps
    assert lm.run(cancel_mid_stream()) == 3
    assert engine.scheduler.running == 0 and engine.scheduler.kv_reserved_tokens == 0
    assert engine.in_flight == 0
    assert engine.steps - steps < 10  # it did not run on to 200 tokens


class HeldDecode:
    """The real decoder, whose decode calls each wait for a permit: holds a step's decode so
    what the engine publishes before it can be seen. ``entered`` counts calls that began."""

    def __init__(self, inner: Decoder) -> None:
        self.inner, self.shape = inner, inner.shape
        self.permits, self.entered = threading.Semaphore(0), threading.Semaphore(0)

    def prefill_rows(self, slots: list[int], tokens: list[list[int]], start: int) -> np.ndarray:
        return self.inner.prefill_rows(slots, tokens, start)

    def decode(self, rows: list[tuple[int, int, int]]) -> np.ndarray:
        self.entered.release()
        assert self.permits.acquire(timeout=30), "a decode call held for 30 s"
        return self.inner.decode(rows)


def test_a_joining_request_gets_its_first_token_before_the_running_rows_decode(
    lm: Loaded,
) -> None:
    engine = lm.engine
    real, held = engine.decoder, HeldDecode(engine.decoder)

    async def entered() -> None:  # the next decode call has begun, and waits
        assert await asyncio.to_thread(held.entered.acquire, True, 30)

    async def join_while_held() -> tuple[int, int]:
        running = [
            engine.submit(Generation(engine.codec.encode("edge fleet"), greedy(12)))
            for _ in range(3)
        ]
        async for _ in running[0]:  # the three decode together now
            break
        engine.decoder = held  # type: ignore[assignment]
        await entered()
        late = engine.submit(Generation(engine.codec.encode("sensor"), greedy(4)))
        held.permits.release()  # that step ends; the next prefills the late prompt, then
        await entered()  # its decode of the three running rows is held:
        first = await asyncio.wait_for(anext(aiter(late)), 10)  # the first token is out
        engine.decoder = real
        held.permits.release(100)
        rest = [d async for d in late]
        for stream in running:
            async for _ in stream:
                pass
        return first.tokens, first.tokens + sum(d.tokens for d in rest)

    try:
        first_tokens, total = lm.run(join_while_held())
    finally:
        held.permits.release(100)
        engine.decoder = real
    assert first_tokens == 1 and total == 4


def test_the_engine_decodes_what_a_plain_greedy_loop_decodes(lm: Loaded) -> None:
    from tests.runtimes.test_tiny_lm import greedy_tokens

    engine = lm.engine
    prompt = "The edge device serves models"
    expected = engine.codec.decode(
        greedy_tokens(lm.repository / "tiny-lm" / "1", engine.codec.encode(prompt), 30)
    )
    assert lm.run(generate(engine, prompt, greedy(30)))[0] == expected


def test_extreme_sampling_parameters_still_give_text(lm: Loaded) -> None:
    engine = lm.engine
    greedy_text = lm.run(generate(engine, "edge", greedy(10)))[0]
    for params in (
        SamplingParams(max_tokens=10, temperature=5e-324),  # the smallest float: greedy
        SamplingParams(max_tokens=10, temperature=1e-6, seed=1),
        SamplingParams(max_tokens=10, temperature=2.0, top_p=1e-9, seed=2),  # one token kept
        SamplingParams(max_tokens=10, temperature=2.0, top_k=100_000, seed=3),
        SamplingParams(
            max_tokens=10, temperature=0.0, presence_penalty=-2.0, frequency_penalty=2.0
        ),
    ):
        text, finish, tokens = lm.run(generate(engine, "edge", params))
        assert finish is not None and 1 <= tokens <= 10
    assert (
        lm.run(generate(engine, "edge", SamplingParams(max_tokens=10, temperature=5e-324)))[0]
        == greedy_text
    )
