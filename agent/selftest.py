"""A model repository's self-test on this machine (``edgefleet models selftest``): each model
placed, loaded and checked against its golden sample. The demo's first step."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from agent.pipelines.offline import has_pipeline, pipeline_golden_problems
from agent.plans import plan_repository
from common.model_config import load_model_config
from runtimes.backends import open_model
from runtimes.errors import RuntimeFailure
from runtimes.golden import GOLDEN_FILE, GoldenSample
from runtimes.hardware.context import HardwareContext
from runtimes.settings import RuntimeSettings


def self_test(repository: Path, cache_dir: Path | None, echo: Callable[[str], None]) -> int:
    """Return a process exit code: 0 when every model loads and passes its self-test."""
    echo("== detecting hardware")
    ctx = HardwareContext.detect()
    echo(f"profile {ctx.profile.name}: {ctx.profile.description}")
    settings = RuntimeSettings(cache_dir=cache_dir)

    failures = 0
    echo("== placing and self-testing each model")
    for mp in plan_repository(repository, ctx):
        if mp.plan is None or mp.model_file is None:
            echo(f"{mp.model}: cannot be placed: {mp.error}")
            failures += 1
            continue
        for skipped in mp.plan.skipped:
            echo(f"{mp.model}: skipped {skipped}")
        try:
            started = time.perf_counter()
            runtime = open_model(mp.model_file, mp.plan.placement, settings)
            loaded = time.perf_counter()
            version_dir = mp.model_file.parent
            config = load_model_config(version_dir.parent)
            if has_pipeline(version_dir, config):  # its golden is a request to the pipeline
                problems = pipeline_golden_problems(version_dir, config, runtime)
            else:
                golden = GoldenSample.load(version_dir / GOLDEN_FILE)
                problems = golden.mismatches(runtime.infer(golden.inputs))
            done = time.perf_counter()
            runtime.close()
        except RuntimeFailure as exc:
            echo(f"{mp.model}: FAILED ({exc.code}): {exc}")
            failures += 1
            continue
        verdict = "self-test passed" if not problems else "self-test FAILED: " + "; ".join(problems)
        failures += bool(problems)
        echo(
            f"{mp.model}: {mp.plan.placement.describe()} [{mp.format}], "
            f"load {1000 * (loaded - started):.0f} ms, "
            f"golden batch {1000 * (done - loaded):.1f} ms, "
            f"{verdict}"
        )
    echo("== done" if not failures else f"== {failures} model(s) failed")
    return 1 if failures else 0
