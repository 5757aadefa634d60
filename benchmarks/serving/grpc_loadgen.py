"""A closed-loop KServe V2 gRPC load generator, meant to run in its own process.

Each of ``concurrency`` clients, on a channel of its own (its own HTTP/2 connection), sends the
same prepared ``ModelInferRequest`` bytes again as soon as the previous answer is in, for
``duration_s``; answers are not parsed (as :mod:`benchmarks.serving.loadgen` reads HTTP bodies
without parsing them), only the first is checked. ``--shm`` puts each client's input and output
in POSIX shared memory regions it registers (Triton's system shared memory), so the messages
carry no tensor bytes. Prints one JSON document::

    python -m benchmarks.serving.grpc_loadgen --target unix:/tmp/agent.sock --model mlp -c 1 -d 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
import uuid
from contextlib import ExitStack
from multiprocessing import shared_memory
from typing import Any

import grpc
import numpy as np

from agent.grpc.proto import grpc_service_pb2 as pb
from benchmarks.serving.bodies import make_bodies

_SERVICE = "/inference.GRPCInferenceService/"
_OPTIONS = [
    ("grpc.max_receive_message_length", 256 * 2**20),
    ("grpc.max_send_message_length", 256 * 2**20),
    ("grpc.use_local_subchannel_pool", 1),  # a connection per client, not one shared
]


def infer_request(
    model: str, row: np.ndarray, *, raw: bool = True, region: tuple[str, str, int] | None = None
) -> pb.ModelInferRequest:
    """One row; ``raw``: in ``raw_input_contents`` (else typed ``fp32_contents``);
    ``region``: (input region, output region, output bytes) in shared memory instead."""
    message = pb.ModelInferRequest(model_name=model)
    tensor = message.inputs.add(name="input", datatype="FP32", shape=list(row.shape))
    if region is not None:
        tensor.parameters["shared_memory_region"].string_param = region[0]
        tensor.parameters["shared_memory_byte_size"].int64_param = row.nbytes
        out = message.outputs.add(name="logits")
        out.parameters["shared_memory_region"].string_param = region[1]
        out.parameters["shared_memory_byte_size"].int64_param = region[2]
    elif raw:
        message.raw_input_contents.append(row.astype("<f4").tobytes())
    else:
        tensor.contents.fp32_contents.extend(row.ravel().tolist())
    return message


def _unary(channel: grpc.aio.Channel, method: str) -> Any:
    # no serializers: bytes in, bytes out
    return channel.unary_unary(_SERVICE + method)


async def _client(
    target: str, body: bytes, stop_at: float, latencies: list[float], errors: list[str]
) -> None:
    async with grpc.aio.insecure_channel(target, options=_OPTIONS) as channel:
        call = _unary(channel, "ModelInfer")
        answer = await call(body, timeout=60)
        response = pb.ModelInferResponse.FromString(answer)
        if not response.outputs:
            errors.append(f"an answer without outputs: {response}")
            return
        try:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                await call(body, timeout=60)
                latencies.append(time.perf_counter() - started)
        except grpc.aio.AioRpcError as exc:
            errors.append(f"{exc.code()}: {exc.details()}")


async def _register(target: str, regions: list[tuple[str, str, int]]) -> None:
    async with grpc.aio.insecure_channel(target, options=_OPTIONS) as channel:
        register = _unary(channel, "SystemSharedMemoryRegister")
        for name, key, size in regions:
            message = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, byte_size=size)
            await register(message.SerializeToString(), timeout=30)


async def _unregister(target: str, names: list[str]) -> None:
    async with grpc.aio.insecure_channel(target, options=_OPTIONS) as channel:
        unregister = _unary(channel, "SystemSharedMemoryUnregister")
        for name in names:
            message = pb.SystemSharedMemoryUnregisterRequest(name=name)
            await unregister(message.SerializeToString(), timeout=30)


async def run(
    target: str,
    model: str,
    concurrency: int,
    duration_s: float,
    *,
    shm: bool = False,
    raw: bool = True,
    output_bytes: int = 0,
) -> dict[str, object]:
    row = make_bodies(model).row
    bodies: list[bytes] = []
    with ExitStack() as stack:
        names: list[str] = []
        if shm:
            # one input region shared by all (read only), an output region per client
            tag = uuid.uuid4().hex[:8]
            segment = shared_memory.SharedMemory(f"bench-{tag}-in", create=True, size=row.nbytes)
            stack.callback(segment.unlink)
            stack.callback(segment.close)
            np.ndarray(row.shape, np.float32, segment.buf)[:] = row
            regions = [(f"in-{tag}", f"/{segment.name}", row.nbytes)]
            for k in range(concurrency):
                out = shared_memory.SharedMemory(
                    f"bench-{tag}-out{k}", create=True, size=output_bytes
                )
                stack.callback(out.unlink)
                stack.callback(out.close)
                regions.append((f"out{k}-{tag}", f"/{out.name}", output_bytes))
            await _register(target, regions)
            names = [r[0] for r in regions]
            for k in range(concurrency):
                region = (names[0], names[k + 1], output_bytes)
                bodies.append(infer_request(model, row, region=region).SerializeToString())
        else:
            bodies = [infer_request(model, row, raw=raw).SerializeToString()] * concurrency
        latencies: list[float] = []
        errors: list[str] = []
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        started = time.monotonic()
        await asyncio.gather(
            *(_client(target, body, started + duration_s, latencies, errors) for body in bodies)
        )
        wall = time.monotonic() - started
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        if names:
            await _unregister(target, names)
    lat = sorted(latencies)

    def pct(p: float) -> float | None:
        return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] if lat else None

    return {
        "requests": len(lat),
        "wall_s": wall,
        "requests_per_s": len(lat) / wall,
        "errors": errors[:5],
        "p50_s": pct(50),
        "p99_s": pct(99),
        "client_cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="closed-loop KServe V2 gRPC load")
    parser.add_argument("--target", required=True, help="host:port or unix:/path")
    parser.add_argument("--model", required=True, choices=["mlp", "cnn"])
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("-d", "--duration", type=float, default=5.0)
    parser.add_argument("--shm", action="store_true", help="tensors in shared memory")
    parser.add_argument("--contents", action="store_true", help="typed contents, not raw")
    parser.add_argument("--output-bytes", type=int, default=0, help="output region size (--shm)")
    args = parser.parse_args()
    work = run(
        args.target,
        args.model,
        args.concurrency,
        args.duration,
        shm=args.shm,
        raw=not args.contents,
        output_bytes=args.output_bytes,
    )
    try:
        import uvloop

        result = uvloop.run(work)
    except ImportError:
        result = asyncio.run(work)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
