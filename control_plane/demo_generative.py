"""The demo's generative chapter: the example ``tiny-lm`` folder pushed as one ``genai``
variant, validated by greedy decoding on every runtime here, rolled out in waves with gates on
the p99 time to first token and between tokens, then asked for a completion on each device
through its OpenAI-compatible API (:func:`control_plane.demo.run_demo` calls it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from control_plane.db.states import RolloutState
from runtimes.examples.tiny_lm import write_tiny_lm
from runtimes.formats import GENAI_CONFIG, GENAI_FORMAT

Echo = Callable[[str], None]
Follow = Callable[[httpx.Client, int, Echo, Callable[[], object]], dict[str, Any]]
MODEL = "tiny-lm"
PROMPT = {"model": MODEL, "prompt": "The fleet", "max_tokens": 12, "temperature": 0}
GATES = {
    "max_error_rate": 0.05,
    "min_requests": 5,
    "max_ttft_p99_ms": 5000.0,
    "max_inter_token_p99_ms": 1000.0,
}


def roll_out_generative(
    api: httpx.Client, agents: dict[str, str], workdir: Path, echo: Echo, follow: Follow
) -> bool:
    """Push, validate and roll out ``tiny-lm`` version 1 to every device; whether it serves."""
    echo(f"== a generative model: {MODEL} v1, one folder, rolled out with token-latency gates")
    folder = workdir / MODEL
    folder.mkdir(parents=True)
    write_tiny_lm(folder)
    _push(api, folder)
    report = api.post(f"/api/v1/models/{MODEL}/versions/1/validate").json()
    for c in report["checks"]:
        echo(f"  {'PASS' if c['passed'] else 'FAIL'} {c['check']}: {c['detail']}")
    if not report["passed"]:
        echo(f"{MODEL} v1 failed validation")
        return False
    spec = {
        "model": MODEL,
        "version": 1,
        "selector": {"site": "demo"},
        "waves": ["1", "100%"],
        "bake_time_s": 2.0,
        "device_timeout_s": 120,
        "gates": GATES,
    }
    resp = api.post("/api/v1/rollouts", json=spec)
    resp.raise_for_status()
    rollout = int(resp.json()["id"])
    ttft, gap = GATES["max_ttft_p99_ms"], GATES["max_inter_token_p99_ms"]
    echo(
        f"rollout {rollout}: waves {spec['waves']}, gates TTFT p99 <= {ttft:g} ms, "
        f"inter-token p99 <= {gap:g} ms"
    )

    def traffic() -> None:  # an app's completions; devices not switched yet answer 503
        for url in agents.values():
            for _ in range(3):
                httpx.post(f"{url}/v1/completions", json=PROMPT, timeout=30)

    doc = follow(api, rollout, echo, traffic)
    for wave, gate in sorted(doc.get("gate_report", {}).items()):
        if gate.get("ttft_p99_ms") is not None:
            echo(
                f"  wave {wave}: TTFT p99 {gate['ttft_p99_ms']:.1f} ms, inter-token p99 "
                f"{gate['inter_token_p99_ms']:.1f} ms over {gate['generated_tokens']} tokens"
            )
    if doc["state"] != RolloutState.SUCCEEDED:
        echo(f"rollout {rollout} did not succeed: {doc['reason']}")
        return False
    for device_id, url in agents.items():
        answer = httpx.post(f"{url}/v1/completions", json=PROMPT, timeout=30).json()
        (card,) = [m for m in httpx.get(f"{url}/v1/models").json()["data"] if m["id"] == MODEL]
        text = answer["choices"][0]["text"]
        echo(
            f"{device_id}: {MODEL} v{card['version']} completes {PROMPT['prompt']!r} with {text!r}"
        )
    return True


def _push(api: httpx.Client, folder: Path) -> None:
    spec = {
        "version": 1,
        "variants": [{"format": GENAI_FORMAT, "profiles": []}],
        "health": {"window_s": 1.0, "min_requests": 100000},  # devices commit; the gates judge
    }
    api.post(f"/api/v1/models/{MODEL}/versions", json=spec).raise_for_status()
    files = sorted(p for p in folder.iterdir() if p.name not in {"golden.npz", GENAI_CONFIG})
    for path in [*files, folder / GENAI_CONFIG]:  # the config completes the variant
        api.put(
            f"/api/v1/models/{MODEL}/versions/1/variants/0/files/{path.name}",
            content=path.read_bytes(),
        ).raise_for_status()
