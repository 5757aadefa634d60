"""llama.cpp's own HTTP server (the ``xllamacpp`` wheel) on a GGUF file, as a process.

``python -m benchmarks.generative.llamacpp_server MODEL.gguf PORT SLOTS CONTEXT THREADS``: serves
the OpenAI API on 127.0.0.1:PORT with SLOTS parallel slots sharing one KV pool of CONTEXT
tokens per slot (continuous batching on, llama.cpp's default), until SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import threading


def main() -> None:
    import xllamacpp  # type: ignore[import-untyped]

    gguf, port, slots, context, threads = sys.argv[1:6]
    params = xllamacpp.CommonParams()
    params.model.path = gguf
    params.hostnames = ["127.0.0.1"]
    params.port = int(port)
    params.n_parallel = int(slots)
    params.n_ctx = int(context) * int(slots)
    params.cont_batching = True
    params.cpuparams.n_threads = int(threads)
    params.cpuparams_batch.n_threads = int(threads)
    params.endpoint_metrics = True
    server = xllamacpp.Server(params)
    print(f"listening on {server.listening_address}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    del server


if __name__ == "__main__":
    main()
