"""The ``classifier`` pipeline end to end against the app that decodes itself.

Both paths run against one agent process serving ``classifier`` and ``cnn`` (the same model
file), in interleaved rounds so that a noisy host weighs on both alike:

- ``pipeline``: the app sends the camera frame's JPEG bytes (binary V2, BYTES) to
  ``classifier`` and reads its top-5 labels;
- ``app-decode``: the app decodes the JPEG with Pillow, resizes it to 224x224, normalises it,
  sends the FP32 tensor to ``cnn`` over binary V2 and takes softmax and top-5 itself.

Goal: the pipeline costs at most 10 % over the decode-in-app path (throughput and p50).
``python -m benchmarks.pipelines.pipeline_bench --duration 8 --repeat 3``
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.serving.systems import agent
from runtimes.examples import write_example_repository
from runtimes.examples.classifier import golden_jpeg, preprocess, top_k

Call = Callable[[http.client.HTTPConnection], list[bytes]]


def _binary_request(
    tensors: list[dict[str, object]], blobs: list[bytes], outputs: list[str]
) -> tuple[bytes, dict[str, str]]:
    for tensor, blob in zip(tensors, blobs, strict=True):
        tensor["parameters"] = {"binary_data_size": len(blob)}
    header = json.dumps(
        {
            "inputs": tensors,
            "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
        }
    ).encode()
    return header + b"".join(blobs), {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


def _post(
    conn: http.client.HTTPConnection, model: str, body: bytes, headers: dict[str, str]
) -> tuple[dict[str, object], bytes]:
    conn.request("POST", f"/v2/models/{model}/infer", body, headers)
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{model}: {response.status} {data[:200]!r}")
    length = int(response.getheader("Inference-Header-Content-Length") or len(data))
    return json.loads(data[:length]), data[length:]


def pipeline_call(jpeg: bytes) -> Call:
    def call(conn: http.client.HTTPConnection) -> list[bytes]:
        blob = struct.pack("<I", len(jpeg)) + jpeg
        body, headers = _binary_request(
            [{"name": "image", "shape": [1], "datatype": "BYTES"}], [blob], ["labels"]
        )
        _, raw = _post(conn, "classifier", body, headers)
        labels, pos = [], 0
        while pos < len(raw):
            (n,) = struct.unpack_from("<I", raw, pos)
            labels.append(raw[pos + 4 : pos + 4 + n])
            pos += 4 + n
        return labels

    return call


def app_decode_call(jpeg: bytes) -> Call:
    def call(conn: http.client.HTTPConnection) -> list[bytes]:
        pixels = preprocess([jpeg], 224)  # what the app does: decode, resize, normalise
        body, headers = _binary_request(
            [{"name": "input", "shape": list(pixels.shape), "datatype": "FP32"}],
            [pixels.tobytes()],
            ["logits"],
        )
        _, raw = _post(conn, "cnn", body, headers)
        logits = np.frombuffer(raw, np.float32).reshape(1, -1)
        labels: list[bytes] = top_k(logits)[0][0].tolist()
        return labels

    return call


def run(port: int, call: Call, clients: int, duration_s: float) -> tuple[float, list[float]]:
    """Requests per second and latencies (s) of ``clients`` closed-loop clients."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop = time.monotonic() + duration_s
    errors: list[BaseException] = []

    def client(mine: list[float]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            while time.monotonic() < stop:
                started = time.perf_counter()
                call(conn)
                mine.append(time.perf_counter() - started)
        except BaseException as exc:  # reported after the run
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(m,)) for m in latencies]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    flat = [x for m in latencies for x in m]
    return len(flat) / (time.monotonic() - began), flat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per cell")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    jpeg = golden_jpeg(640, 480, seed=3)  # a VGA camera frame
    paths = {"pipeline": pipeline_call(jpeg), "app-decode": app_decode_call(jpeg)}
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "models"
        write_example_repository(repo, models=("cnn", "classifier"))
        probe = json.dumps(
            {
                "inputs": [
                    {
                        "name": "input",
                        "shape": [1, 3, 224, 224],
                        "datatype": "FP32",
                        "data": [0.0] * (3 * 224 * 224),
                    }
                ]
            }
        ).encode()
        with agent(repo, "cnn", probe, Path(scratch)) as running:
            port = int(running.base_url.rsplit(":", 1)[1])
            conn = http.client.HTTPConnection("127.0.0.1", port)
            answers = {name: call(conn) for name, call in paths.items()}
            conn.close()
            assert answers["pipeline"] == answers["app-decode"], answers  # the same top-5
            results: dict[tuple[str, int], list[tuple[float, list[float]]]] = {}
            for r in range(args.repeat):
                for clients in args.clients:
                    order = list(paths) if r % 2 == 0 else list(reversed(paths))
                    for name in order:
                        run(port, paths[name], clients, min(1.0, args.duration / 4))  # warm
                        results.setdefault((name, clients), []).append(
                            run(port, paths[name], clients, args.duration)
                        )
    print(
        f"classifier pipeline vs app-decode, {args.repeat} rounds of {args.duration:g} s, "
        "medians of the rounds\n"
    )
    print("| clients | path | req/s | p50 ms | p95 ms | pipeline / app-decode (req/s, p50) |")
    print("|---|---|---|---|---|---|")
    for clients in args.clients:
        row = {}
        for name in paths:
            rounds = results[(name, clients)]
            rps = statistics.median(r[0] for r in rounds)
            p50 = statistics.median(float(np.percentile(r[1], 50)) for r in rounds) * 1000
            p95 = statistics.median(float(np.percentile(r[1], 95)) for r in rounds) * 1000
            row[name] = (rps, p50, p95)
        for name, (rps, p50, p95) in row.items():
            ratio = ""
            if name == "pipeline":
                app = row["app-decode"]
                ratio = f"{rps / app[0]:.3f}, {p50 / app[1]:.3f}"
            print(f"| {clients} | {name} | {rps:,.1f} | {p50:.1f} | {p95:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
