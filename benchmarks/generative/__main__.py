"""``python -m benchmarks.generative [--size bench] [--levels 1,4,8,16] ...``: README.md here."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks.generative.bench import SYSTEMS, Plan, run
from benchmarks.generative.report import as_json, markdown
from runtimes.examples.tiny_lm import LmSize


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.generative")
    parser.add_argument("--size", choices=[s.value for s in LmSize], default=LmSize.BENCH.value)
    parser.add_argument("--levels", default="1,4,8,16", help="concurrent streams, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per stream")
    parser.add_argument("--long-tokens", type=int, default=128, help="the 8 long streams' tokens")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--peer-threads", type=int, default=1, help="threads of the raw loop and both peers"
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--work", type=Path, default=Path("/tmp/edgefleet-genbench"))
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    plan = Plan(
        size=LmSize(args.size),
        levels=tuple(int(x) for x in args.levels.split(",")),
        max_tokens=args.max_tokens,
        long_tokens=args.long_tokens,
        repeats=args.repeats,
        systems=tuple(s for s in args.systems.split(",") if s),
        peer_threads=args.peer_threads,
    )
    started = time.monotonic()
    load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    results = run(plan, args.work)
    print(markdown(results))
    print(f"load average at the start {load_before}; run took {time.monotonic() - started:.0f} s")
    if args.out:
        args.out.write_text(json.dumps(as_json(results), indent=2) + "\n")


if __name__ == "__main__":
    main()
