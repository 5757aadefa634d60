"""Data capture on the device, without threads racing the test: the policy's validation, the
tap's decisions (sample rate, low-confidence rows, the per-minute cap, a full queue), the
spool's disk cap and retention, the shadow trigger, and the uploader's acknowledgement
bookkeeping."""

from __future__ import annotations

import asyncio
import io
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from agent.fleet.capture_upload import CaptureUploader
from agent.fleet.settings import FleetSettings
from agent.inference.capture import CaptureTap, encode, top1_probability
from agent.inference.capture_spool import CaptureSpool, Sample
from agent.inference.shadow import Shadow
from common.model_config import CaptureConfig, ModelConfigError, parse_model_config
from common.protocol.capture import CaptureTrigger, DeviceTelemetry, FleetAck


def tap(tmp_path: Path, **kwargs: object) -> CaptureTap:
    return CaptureTap(CaptureSpool(tmp_path / "spool.sqlite3"), seed=1, **kwargs)  # type: ignore[arg-type]


def load(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {k: archive[k] for k in archive.files}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[capture]\nenabled = true\nsample_rate = 1.5\n", "capture.sample_rate"),
        ("[capture]\nenabled = true\nlow_confidence_below = 0\n", "capture.low_confidence_below"),
        ("[capture]\nenabled = true\nmax_sample_bytes = 999999999\n", "capture.max_sample_bytes"),
        ("[capture]\nenabled = true\nretention_days = -1\n", "capture.retention_days"),
        ("[capture]\nenabled = true\nsample_rat = 1\n", "capture.sample_rat"),
        ("[capture]\nenabled = true\n", "captures nothing"),
    ],
)
def test_bad_policy_fields_are_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(ModelConfigError) as refused:
        parse_model_config(text, "digits/config.toml")
    assert field in str(refused.value) and "digits/config.toml" in str(refused.value)


def test_capture_is_off_by_default(tmp_path: Path) -> None:
    assert not parse_model_config("", "x").capture.enabled
    t = tap(tmp_path)
    x, y = np.ones((2, 3), np.float32), np.array([[0.1, 0.9], [0.5, 0.5]], np.float32)
    t.offer("m", 1, CaptureConfig(), {"input": x}, {"output": y})
    t.offer("m", 1, CaptureConfig(sample_rate=1.0), {"input": x}, {"output": y})  # not enabled
    t.drain()
    assert t.spool.pending() == {} and t.snapshot() == {}
    t.close()


def test_low_confidence_keeps_only_the_low_rows(tmp_path: Path) -> None:
    t = tap(tmp_path)
    policy = CaptureConfig(enabled=True, low_confidence_below=0.6)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    y = np.array([[0.9, 0.1], [0.55, 0.45], [0.2, 0.8], [0.5, 0.5]], np.float32)
    t.offer("m", 3, policy, {"input": x}, {"output": y})
    t.offer("m", 3, policy, {"input": x[:1]}, {"output": y[:1]})  # confident: not captured
    t.drain()
    (sample,) = t.spool.oldest(10)
    assert sample.trigger is CaptureTrigger.LOW_CONFIDENCE and sample.rows == 2
    arrays = load(sample.data)
    np.testing.assert_array_equal(arrays["input:input"], x[[1, 3]])
    np.testing.assert_array_equal(arrays["output:output"], y[[1, 3]])
    t.close()


def test_logits_are_softmaxed_before_they_are_judged() -> None:
    top = top1_probability(np.array([[10.0, 0.0], [0.1, 0.0]], np.float32))
    assert top is not None and top[0] > 0.99 and 0.5 < top[1] < 0.53
    assert top1_probability(np.ones((3,), np.float32)) is None  # not [N, classes]


def test_caps_drop_and_count(tmp_path: Path) -> None:
    now = [0.0]
    t = tap(tmp_path, clock=lambda: now[0])
    policy = CaptureConfig(enabled=True, sample_rate=1.0, max_samples_per_minute=3)
    x, y = np.ones((1, 3), np.float32), np.array([[0.1, 0.9]], np.float32)
    for _ in range(5):
        t.offer("m", 1, policy, {"input": x}, {"output": y})
    now[0] = 61.0  # a new minute
    t.offer("m", 1, policy, {"input": x}, {"output": y})
    big = np.random.default_rng(0).random((1, 100_000)).astype(np.float32)  # incompressible
    t.offer("m", 1, policy, {"input": big}, {"output": y})
    t.drain()
    counts = t.snapshot()["m"]
    assert counts.captured == {"sampled": 4}
    assert counts.dropped == {"rate_limited": 2, "too_large": 1}
    t.close()


class SlowSpool(CaptureSpool):
    """A spool whose disk is slow: each add waits until the test lets it go."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entered, self.go = threading.Event(), threading.Event()

    def add(self, sample: Sample, max_disk_bytes: int) -> int:
        self.entered.set()
        assert self.go.wait(30)
        return super().add(sample, max_disk_bytes)


def test_a_full_queue_drops_and_counts(tmp_path: Path) -> None:
    spool = SlowSpool(tmp_path / "spool.sqlite3")
    t = CaptureTap(spool, queue_samples=1)
    policy = CaptureConfig(enabled=True, sample_rate=1.0)
    x, y = {"input": np.ones((1, 3))}, {"output": np.ones((1, 2))}
    t.offer("m", 1, policy, x, y)
    assert spool.entered.wait(30)  # the writer holds the first
    t.offer("m", 1, policy, x, y)  # queued
    t.offer("m", 1, policy, x, y)  # no room: dropped, the request not slowed
    assert t.snapshot()["m"].dropped == {"queue_full": 1}
    spool.go.set()
    t.drain()
    assert t.snapshot()["m"].captured == {"sampled": 2}
    t.close()


def test_the_spool_keeps_the_newest_within_its_disk_cap_and_retention(tmp_path: Path) -> None:
    spool = CaptureSpool(tmp_path / "spool.sqlite3")
    data = encode({"input": np.zeros((1, 64), np.float32)}, {}, None)
    now = time.time()
    evicted = [
        spool.add(
            Sample(f"{i:032x}", "m", 1, now - 10 + i, CaptureTrigger.SAMPLED, 1, data),
            max_disk_bytes=3 * len(data),
        )
        for i in range(5)
    ]
    assert evicted == [0, 0, 0, 1, 1]
    assert [s.sample_id for s in spool.oldest(10)] == [f"{i:032x}" for i in (2, 3, 4)]
    assert spool.expire("m", retention_days=6.5 / 86400, now=now) == 2  # older than 6.5 s
    assert spool.pending() == {"m": (1, len(data))}
    spool.close()
    reopened = CaptureSpool(tmp_path / "spool.sqlite3")  # across a restart
    assert [s.sample_id for s in reopened.oldest(10)] == [f"{4:032x}"]
    reopened.close()


def test_uploads_leave_the_spool_only_once_acknowledged(tmp_path: Path) -> None:
    t = tap(tmp_path)
    policy = CaptureConfig(enabled=True, sample_rate=1.0)
    for i in range(3):
        t.offer("m", 1, policy, {"input": np.full((1, 3), i)}, {"output": np.ones((1, 2))})
    t.drain()
    settings = FleetSettings(mqtt_url="mqtt://127.0.0.1:1", device_id="box", telemetry_resend_s=5)
    up = CaptureUploader(t, "box", settings)
    first = up.next_upload(now=0.0)
    assert first is not None and len(first.samples) == 3
    assert up.next_upload(now=1.0) is None  # all in flight
    assert up.next_due_s(now=1.0) == 4.0
    parsed = DeviceTelemetry.validate_json(first.model_dump_json())
    assert parsed == first  # the telemetry topic's parse tells it from telemetry
    ack = FleetAck.validate_json(
        f'{{"kind": "capture-ack", "device_id": "box", "sample_ids": ["{first.samples[0].sample_id}"]}}'
    )
    up.acknowledged(ack.sample_ids)  # type: ignore[union-attr]
    again = up.next_upload(now=6.0)  # the others were not acknowledged in time: sent again
    assert again is not None and [s.sample_id for s in again.samples] == [
        s.sample_id for s in first.samples[1:]
    ]
    up.reconnected()
    assert up.next_upload(now=6.5) is not None  # a new session: sent again at once
    assert t.snapshot()["m"].uploaded == 1
    t.close()


class Candidate:
    """A shadow candidate that answers ``answer`` to every copy."""

    def __init__(self, answer: dict[str, np.ndarray]) -> None:
        self.answer = answer
        self.calls = 0

    async def __call__(
        self, inputs: dict[str, np.ndarray], rows: int
    ) -> tuple[dict[str, np.ndarray], float]:
        self.calls += 1
        return self.answer, 0.001


def test_a_shadow_disagreement_is_captured_with_the_served_answer(tmp_path: Path) -> None:
    t = tap(tmp_path)
    policy = CaptureConfig(enabled=True, shadow_disagreement=True)
    served = {"logits": np.array([[0.1, 0.9]], np.float32)}
    flipped = {"logits": np.array([[0.9, 0.1]], np.float32)}
    agreeing = {"input": np.zeros((1, 4), np.float32)}
    disagreeing = {"input": np.ones((1, 4), np.float32)}

    async def main() -> None:
        answers = Candidate(served)
        shadow = Shadow("m", 2, answers, sample_share=1.0)
        shadow.on_disagreement = lambda m, v, x, y: t.offer_disagreement(m, v, policy, x, y)
        shadow.start()
        try:
            shadow.offer(agreeing, 1, served, 0.001, serving=1)
            async with asyncio.timeout(10):
                while answers.calls < 1:
                    await asyncio.sleep(0.001)
            answers.answer = flipped
            shadow.offer(disagreeing, 1, served, 0.001, serving=1)
            async with asyncio.timeout(10):
                while shadow.queued or answers.calls < 2:
                    await asyncio.sleep(0.001)
                await asyncio.sleep(0)  # the comparison runs after the call returns
        finally:
            await shadow.close()

    asyncio.run(main())
    t.drain()
    (sample,) = t.spool.oldest(10)
    assert (sample.model, sample.version) == ("m", 1)  # the serving version's answer
    assert sample.trigger is CaptureTrigger.SHADOW_DISAGREEMENT
    arrays = load(sample.data)
    np.testing.assert_array_equal(arrays["input:input"], disagreeing["input"])
    np.testing.assert_array_equal(arrays["output:logits"], served["logits"])
    t.close()


def test_a_pipeline_captures_the_raw_input_the_app_sent(example_repo: Path, tmp_path: Path) -> None:
    """The ``classifier`` pipeline on a local agent with a spool: the JPEG's bytes are the
    sample's input, the top-5 labels its outputs."""
    import tritonclient.http as triton

    from tests.agent.pipelines.conftest import jpeg
    from tests.agent.server import copy_models, serve

    repo = copy_models(example_repo, tmp_path / "repo", "classifier")
    config = repo / "classifier" / "config.toml"
    before = config.read_text() if config.exists() else ""
    config.write_text(before + "\n[capture]\nenabled = true\nsample_rate = 1.0\n")
    image = jpeg(64, 48, seed=3)
    spool_file = tmp_path / "capture.sqlite3"
    with serve(repo, capture={"spool_file": spool_file}) as agent:
        client = triton.InferenceServerClient(agent.url.removeprefix("http://"))
        tensor = triton.InferInput("image", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([image], dtype=object), binary_data=True)
        try:
            client.infer("classifier", [tensor])
        finally:
            client.close()
        tap = agent.state.service.capture
        assert tap is not None
        tap.drain()
        (sample,) = tap.spool.oldest(10)
    arrays = load(sample.data)
    assert arrays["input:image"].tolist() == [image]
    assert {k for k in arrays if k.startswith("output:")}, arrays.keys()


def test_the_docs_capture_blocks_are_what_the_agent_takes(tmp_path: Path) -> None:
    from agent.settings import AgentSettings
    from common.model_config import ModelConfig

    docs = Path(__file__).resolve().parents[3] / "docs"

    def first_toml(page: str, heading: str) -> dict[str, object]:
        section = (docs / page).read_text().split(heading, 1)[1].split("\n## ", 1)[0]
        return tomllib.loads(section.split("```toml\n", 1)[1].split("```", 1)[0])

    policy = ModelConfig.model_validate(first_toml("model-quality.md", "## Data capture")).capture
    assert policy.enabled and policy.low_confidence_below == 0.6 and policy.shadow_disagreement
    settings = AgentSettings(model_repository=tmp_path, **first_toml("agent.md", "## Data capture"))
    assert settings.capture.spool_file == Path("/var/lib/edgefleet/capture.sqlite3")
