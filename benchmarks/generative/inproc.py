"""The in-process systems, each run in a child process of its own so its RSS is its own.

``python -m benchmarks.generative.inproc raw|genai FOLDER STREAMS MAX_TOKENS PROMPT THREADS``
prints one JSON object: per stream the send time and the monotonic time of each generated
token, and the process's peak RSS.

- ``raw``: a greedy loop a competent user writes on ``onnxruntime`` at batch 1: the prompt in
  one call, then one token per call with ``present.*`` fed back as the next ``past_key_values.*``
  (the cache grows by one position a step; nothing is padded). Streams run one after another.
- ``genai``: ``onnxruntime-genai``'s ``Engine``. Its continuous (``dynamic_batching``) mode wants
  a model with packed ``position_ids`` ``[num_tokens]``, which this folder's ``[batch, seq]``
  decoder is not, so it runs the static engine: all streams submitted at once, one batch.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _config(folder: Path) -> dict[str, Any]:
    model: dict[str, Any] = json.loads((folder / "genai_config.json").read_text())["model"]
    return model


def raw_loop(
    folder: Path, streams: int, max_tokens: int, prompt: str, threads: int
) -> list[dict[str, Any]]:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    config = _config(folder)
    decoder = config["decoder"]
    layers, heads, size = (
        decoder["num_hidden_layers"],
        decoder["num_key_value_heads"],
        decoder["head_size"],
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(
        str(folder / decoder["filename"]), options, providers=["CPUExecutionProvider"]
    )
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(prompt).ids
    names = [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    out: list[dict[str, Any]] = []
    for _ in range(streams):
        sent = time.monotonic()
        past = {
            f"past_key_values.{i}.{k}": np.zeros((1, heads, 0, size), np.float32)
            for i in range(layers)
            for k in ("key", "value")
        }
        tokens = np.array([ids], dtype=np.int64)
        position = 0
        times: list[float] = []
        for _ in range(max_tokens):
            q = tokens.shape[1]
            feed = {
                "input_ids": tokens,
                "position_ids": np.arange(position, position + q, dtype=np.int64)[None],
                "attention_mask": np.ones((1, position + q), dtype=np.int64),
                **past,
            }
            logits, *presents = session.run(["logits", *names], feed)
            past = {
                f"past_key_values.{n[len('present.') :]}": p
                for n, p in zip(names, presents, strict=True)
            }
            position += q
            tokens = np.array([[int(np.argmax(logits[0, -1]))]], dtype=np.int64)
            times.append(time.monotonic())
        out.append({"sent": sent, "times": times, "prompt_tokens": len(ids)})
    return out


def genai_engine(
    folder: Path, streams: int, max_tokens: int, prompt: str, threads: int
) -> list[dict[str, Any]]:
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    overlay = {
        "engine": {"static_batching": {"max_batch_size": max(streams, 1)}},
        "model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}},
    }
    config.overlay(json.dumps(overlay))
    model = og.Model(config)
    tokenizer = og.Tokenizer(model)
    engine = og.Engine(model)
    ids = np.array(tokenizer.encode(prompt), dtype=np.int32)
    requests: list[Any] = []
    records: dict[int, dict[str, Any]] = {}
    for _ in range(streams):
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(max_tokens)
        options.set_do_sample(False)
        records[id(request)] = {"sent": time.monotonic(), "times": [], "prompt_tokens": len(ids)}
        request.begin_turn(ids, options)
        requests.append(request)  # a request dropped by Python leaves the engine
    buffer = engine.create_event_buffer(max(64, 4 * streams))
    while engine.has_pending_requests():
        events = list(engine.run(buffer))
        now = time.monotonic()
        for event in events:
            if event.flags & og.EngineEventFlags.TOKEN:
                records[id(event.request)]["times"].append(now)
            if event.flags & og.EngineEventFlags.FAILED:
                raise RuntimeError(f"onnxruntime-genai: a request failed ({event.error_code})")
    return list(records.values())


def main() -> None:
    system, folder, streams, max_tokens, prompt, threads = sys.argv[1:7]
    run = {"raw": raw_loop, "genai": genai_engine}[system]
    records = run(Path(folder), int(streams), int(max_tokens), prompt, int(threads))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"streams": records, "rss_mib": peak_kib / 1024}))


if __name__ == "__main__":
    main()
