"""Schema-driven fuzzing with schemathesis, bounded: every operation of an OpenAPI document,
with data that fits the schema and data that does not, a fixed number of cases each.

Hypothesis drives each operation on its own so the run is bounded by ``examples`` per
(operation, mode, path variant), and every failure is collected rather than the first one
stopping the run: a report lists them all with a curl command to replay each.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

ANSWER_TIMEOUT_S = 20.0
"""A request without an answer by then counts as a hang."""


@dataclass
class FuzzReport:
    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    per_operation: Counter[str] = field(default_factory=Counter)
    seconds_per_operation: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        slowest = ", ".join(
            f"{op} {s:.0f} s" for op, s in self.seconds_per_operation.most_common(4)
        )
        return (
            f"{self.cases} cases over {len(self.per_operation)} operations in "
            f"{self.seconds:.0f} s; statuses {dict(sorted(self.statuses.items()))}; "
            f"slowest: {slowest}"
        )


def fuzz(
    doc: dict[str, Any],
    base_url: str,
    *,
    examples: int,
    fixed_examples: int | None = None,
    headers: dict[str, str] | None = None,
    path_variants: Iterable[dict[str, str]] = (),
    skip: Iterable[str] = (),
) -> FuzzReport:
    """Run every operation of ``doc`` against ``base_url``.

    Each of ``path_variants`` fixes path parameters (a model that exists, so requests reach
    the codecs rather than a 404), tried besides random ones on every operation that has them.
    """
    report = FuzzReport()
    started = time.monotonic()
    schema = schemathesis.openapi.from_dict(doc)
    session = requests.Session()
    session.headers.update(headers or {})
    skipped = set(skip)
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.label in skipped:
            continue
        names = {p.name for p in operation.path_parameters}
        variants: list[dict[str, str]] = [{}]
        for variant in path_variants:
            if set(variant) <= names:
                variants.append(variant)
        op_started = time.monotonic()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for fixed in variants:
                n = examples if not fixed else (fixed_examples or examples)
                _run(operation, mode, fixed, base_url, session, n, report)
        report.seconds_per_operation[operation.label] += time.monotonic() - op_started
    report.seconds = time.monotonic() - started
    return report


def _run(
    operation: Any,
    mode: GenerationMode,
    fixed: dict[str, str],
    base_url: str,
    session: requests.Session,
    examples: int,
    report: FuzzReport,
) -> None:
    strategy = operation.as_strategy(generation_mode=mode, path_parameters=fixed or None)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: failures are collected
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def one(case: Any) -> None:
        report.cases += 1
        report.per_operation[operation.label] += 1
        try:
            response = case.call(base_url=base_url, session=session, timeout=ANSWER_TIMEOUT_S)
        except requests.Timeout:
            report.failures.append(f"no answer in {ANSWER_TIMEOUT_S} s: {_replay(case)}")
            return
        except requests.ConnectionError as exc:
            report.failures.append(f"connection failed ({exc}): {_replay(case)}")
            return
        report.statuses[response.status_code] += 1
        if response.status_code >= 500:
            report.failures.append(
                f"{response.status_code} {response.text[:200]!r}: {_replay(case)}"
            )

    try:
        one()
    except Unsatisfiable:
        pass  # e.g. no way to break the schema of an operation without parameters


def _replay(case: Any) -> str:
    try:
        return str(case.as_curl_command())[:600]
    except Exception:  # a replay string is a convenience; never hide the failure behind it
        return f"{case.method} {case.formatted_path} body={case.body!r:.300}"
