"""The agent's Python calls per request on its event loop: a count, where a timing is noise.

On a shared machine whose speed moves by a third from one minute to the next, a change worth a
few percent of the event loop's time cannot be seen in throughput. The number of Python
functions the loop's thread enters, and of C functions it calls from Python, per request, does
not move with the machine. The agent runs here under a ``sys.setprofile`` hook on its main
thread (the event loop's; the instances' threads are not counted), serves ``--model`` from the
example repository under the load generator, and the counts of one measured run are divided by
the requests answered. Prints one JSON document: calls per request, and the functions that make
most of them (a function's own entry and the C calls it makes)::

    python -m benchmarks.serving.calls --model cnn --body binary -c 8 \\
        --config 'instances = 2
    [batching]
    max_batch_size = 0'

The hook slows the agent several times over: the counts, not its rate, are the result.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from benchmarks.serving.bodies import make_bodies
from benchmarks.serving.suite import run_load
from benchmarks.serving.systems import free_port, quiet_env, server_process
from runtimes.examples import write_example_repository

SERVE = "--serve-counting-into"


def _serve_counting(out: Path, argv: list[str]) -> None:
    """The agent (``edgefleet`` with ``argv``), its main thread's calls counted: SIGUSR1 starts
    a count afresh, SIGUSR2 writes it to ``out``."""
    counts: collections.Counter[str] = collections.Counter()

    def where(frame: FrameType) -> str:
        code = frame.f_code
        return f"{Path(code.co_filename).name}:{code.co_firstlineno}:{code.co_name}"

    def hook(frame: FrameType, event: str, _: Any) -> None:
        if event in ("call", "c_call"):  # a C call counts for the function that makes it
            counts[where(frame)] += 1

    def restart(*_: object) -> None:
        counts.clear()

    def dump(*_: object) -> None:
        written = out.with_suffix(".part")
        written.write_text(json.dumps(counts.most_common()))
        written.replace(out)  # whole, for the reader waiting for it

    signal.signal(signal.SIGUSR1, restart)
    signal.signal(signal.SIGUSR2, dump)
    assert threading.current_thread() is threading.main_thread()
    sys.setprofile(hook)  # this thread only: the event loop's
    from common.cli import main

    sys.argv = ["edgefleet", *argv]
    main()


def count_calls(
    model: str, body: str, concurrency: int, duration_s: float, config: str, top: int
) -> dict[str, Any]:
    bodies = make_bodies(model)
    payload, headers = bodies.json if body == "json" else bodies.binary
    with tempfile.TemporaryDirectory(prefix="edgefleet-calls-") as scratch:
        root = Path(scratch)
        repo = root / "models"
        write_example_repository(repo, models=(model,))
        if config:
            (repo / model / "config.toml").write_text(config)
        port, out = free_port(), root / "counts.json"
        args = [sys.executable, "-m", "benchmarks.serving.calls", SERVE, str(out), "agent"]
        args += ["--model-repository", str(repo), "--port", str(port)]
        env = quiet_env(EDGEFLEET_AGENT_ACCESS_LOG="false", EDGEFLEET_AGENT_LOG_LEVEL="WARNING")
        with server_process(
            "agent", args, env, port, model, bodies.json[0], root / "agent.log"
        ) as srv:
            url = srv.infer_url(model)
            run_load(url, payload, headers, concurrency, min(duration_s, 2.0))  # warm
            os.kill(srv.process.pid, signal.SIGUSR1)
            result = run_load(url, payload, headers, concurrency, duration_s)
            os.kill(srv.process.pid, signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not out.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the agent wrote no counts")
                time.sleep(0.05)
            counts: list[tuple[str, int]] = json.loads(out.read_text())
    answered = result["statuses"].get("200", 0)
    if not answered:
        raise RuntimeError(f"no request was answered: {result['statuses']}")
    total = sum(n for _, n in counts)
    by_file: collections.Counter[str] = collections.Counter()
    for name, n in counts:
        by_file[name.split(":")[0]] += n
    return {
        "model": model,
        "body": body,
        "concurrency": concurrency,
        "config": config,
        "requests": answered,
        "calls_per_request": round(total / answered, 1),
        "by_file": {f: round(n / answered, 1) for f, n in by_file.most_common(top)},
        "by_function": {f: round(n / answered, 2) for f, n in counts[:top]},
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SERVE]:
        _serve_counting(Path(argv[1]), argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--body", default="binary", choices=["json", "binary"])
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("-d", "--duration", type=float, default=3.0, help="seconds counted")
    parser.add_argument("--config", default="", help="the model's config.toml")
    parser.add_argument("--top", type=int, default=30, help="functions and files listed")
    args = parser.parse_args(argv)
    report = count_calls(
        args.model, args.body, args.concurrency, args.duration, args.config, args.top
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
