"""Reading a console form into the API's documents: one field, a list, ``key=value`` pairs.
The API checks every value; these only shape the text an operator typed."""

from __future__ import annotations

from typing import Any

from control_plane.console.web import BadForm

Fields = dict[str, list[str]]


def one(fields: Fields, name: str) -> str:
    """The last value of ``name``, stripped ("" when the form has none)."""
    return (fields.get(name) or [""])[-1].strip()


def listed(fields: Fields, name: str) -> list[str]:
    """Every non-blank value of ``name`` (checkboxes ticked, a comma-separated field split)."""
    return [part.strip() for v in fields.get(name, []) for part in v.split(",") if part.strip()]


def pairs(text: str, what: str = "selector") -> dict[str, str]:
    """``key=value, key=value`` as a dict; a part without ``=`` is a 400 naming ``what``."""
    out = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BadForm(400, f"{what}: expected key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def required(fields: Fields, *names: str) -> list[str]:
    """The values of ``names``, each one needed: a blank one is a 400 naming them all."""
    values = [one(fields, n) for n in names]
    if not all(values):
        raise BadForm(
            400, f"{' and '.join(names)}: {'all are' if len(names) > 1 else 'it is'} needed"
        )
    return values


def rollout_spec(fields: Fields) -> dict[str, Any]:
    """The API's rollout document from the form (a deployment's too: it is a rollout's spec
    with a name): blank fields keep the API's defaults, and the API checks every value (a
    wrong one comes back as its 400, shown on the form)."""
    model, version = required(fields, "model", "version")
    spec: dict[str, Any] = {
        "model": model,
        "version": version,
        "selector": pairs(one(fields, "selector")),
        "profiles": listed(fields, "profiles"),
    }
    if waves := listed(fields, "waves"):
        spec["waves"] = waves
    for name in ("bake_time_s", "device_timeout_s"):
        if value := one(fields, name):
            spec[name] = value
    spec["gates"] = _gates(fields)
    if shadow := _shadow(fields):
        spec["shadow"] = shadow
    return spec


GATES = (
    "max_error_rate",
    "max_p99_ratio",
    "min_requests",
    "max_rejections",
    "max_drift",
    "max_accuracy_drop",
    "min_outcomes",
    "max_ttft_p99_ms",
    "max_inter_token_p99_ms",
)
"""The gates a form may give, by the API's names (a blank one keeps the API's default)."""
SHADOW = {
    "shadow_share": "sample_share",
    "min_agreement": "min_agreement",
    "shadow_min_requests": "min_requests",
    "shadow_timeout_s": "timeout_s",
}
"""A form's shadow fields and the API's names for them."""


def _gates(fields: Fields) -> dict[str, Any]:
    gates: dict[str, Any] = {"allow_unjudged": one(fields, "allow_unjudged") == "on"}
    if one(fields, "skip_self_test") == "on":  # a box to tick off: blank keeps the default
        gates["self_test"] = False
    for name in GATES:
        if value := one(fields, name):
            gates[name] = value
    return gates


def _shadow(fields: Fields) -> dict[str, Any] | None:
    """The shadow phase, when the form asks for one (a share of requests to copy)."""
    if not one(fields, "shadow_share"):
        return None
    return {api: value for form, api in SHADOW.items() if (value := one(fields, form))}
