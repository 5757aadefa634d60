"""The msgspec mirror of a wire model (control_plane/ingest/decode.py) against the model itself:
whatever the mirror accepts, the model accepts with the same values (a time finer than a
microsecond is rounded where the model truncates it: at most 1 us apart), so decoding with the
mirror first changes what ingest stores in no other case; what it refuses, the model decides."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.protocol.messages import (
    DeviceStatus,
    DeviceTelemetry,
    ModelTelemetry,
    Telemetry,
    UpdateEvent,
)
from control_plane.db.models import DeviceSample, TelemetrySample
from control_plane.ingest.decode import FastDecoder, mirror
from control_plane.ingest.rows import (
    DEVICE_SAMPLE_COLUMNS,
    SAMPLE_COLUMNS,
    TELEMETRY_TABLES,
    storable_bounds,
    telemetry_rows,
    unstorable_rows,
)

DECODER = FastDecoder(Telemetry)
GOOD: dict[str, Any] = {
    "schema_version": 1,
    "device_id": "dev-1",
    "seq": 12,
    "time": "2026-12-04T04:24:18.827846Z",
    "window_s": 10.0,
    "models": [
        {
            "model": "mlp",
            "version": 2,
            "requests": 120,
            "errors": 0,
            "rows": 120,
            "batches": 40,
            "p50_ms": 1.2,
            "p99_ms": None,
            "queue_depth": 3,
        }
    ],
    "device": {"cpu_percent": 12.5, "memory_used_bytes": 2**40, "accelerators": {"gpu": 0.5}},
    "dropped": 0,
}

# Values that probe where JSON decoders differ: coercions, bounds, odd times and numbers.
ODD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    1,
    2**63,
    2**64 + 1,
    -(2**63) - 1,
    1.0,
    1.5,
    1e400,
    -0.0,
    "",
    "12",
    "1.5",
    "true",
    "\ud800",
    "x\x00y",
    "2026-12-04T04:24:18Z",
    "2026-12-04T04:24:18+02:00",
    "2026-12-04T04:24:18",
    "2026-12-04 04:24:18Z",
    "2026-12-04t04:24:18z",
    "2026-12-04T04:24:18.1234567891Z",
    "2026-12-04T04:24:60Z",
    "2026-12-04T24:00:00Z",
    "2026-12-04",
    "2026-12-04T04:24Z",
    "20261204T042418Z",
    1764822258,
    [],
    {},
    {"model": "x"},
    "2026-12-04T04:24:18.9999996Z",
]
ODD = st.sampled_from(ODD_VALUES)
PATHS = [
    ("schema_version",),
    ("device_id",),
    ("seq",),
    ("time",),
    ("window_s",),
    ("dropped",),
    ("models",),
    ("models", 0, "version"),
    ("models", 0, "requests"),
    ("models", 0, "p50_ms"),
    ("models", 0, "model"),
    ("device",),
    ("device", "cpu_percent"),
    ("device", "memory_used_bytes"),
    ("device", "accelerators"),
    ("device", "accelerators", "gpu"),
    ("extra",),
    ("models", 0, "extra"),
]


def _put(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def _builtins(value: Any) -> Any:
    """A decoded message as plain data (datetimes as instants with their offset)."""
    if isinstance(value, BaseModel | msgspec.Struct):
        names = (
            type(value).model_fields if isinstance(value, BaseModel) else value.__struct_fields__
        )
        return {n: _builtins(getattr(value, n)) for n in names}
    if isinstance(value, list):
        return [_builtins(v) for v in value]
    if isinstance(value, dict):
        return {k: _builtins(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return value
    if isinstance(value, float) and value != value:
        return "nan"
    return (type(value), value)


def _same_outcome(raw: bytes) -> None:
    fast = DECODER.decode(raw)
    if fast is None:
        return  # the model decides, as it did before the mirror
    model = Telemetry.model_validate_json(raw)  # raises if the mirror accepted too much
    _assert_same(_builtins(fast), _builtins(model))


def _assert_same(fast: Any, model: Any) -> None:
    if isinstance(fast, datetime):
        assert isinstance(model, datetime) and fast.utcoffset() == model.utcoffset()
        assert abs(fast - model) <= timedelta(microseconds=1)
    elif isinstance(fast, dict):
        assert isinstance(model, dict) and fast.keys() == model.keys()
        for key, value in fast.items():
            _assert_same(value, model[key])
    elif isinstance(fast, list):
        assert isinstance(model, list) and len(fast) == len(model)
        for a, b in zip(fast, model, strict=True):
            _assert_same(a, b)
    else:
        assert fast == model


def test_every_single_odd_value_decodes_as_the_model_decodes_it() -> None:
    for path in PATHS:
        for value in ODD_VALUES:
            doc = json.loads(json.dumps(GOOD))
            _put(doc, path, copy.deepcopy(value))
            _same_outcome(json.dumps(doc).encode())


def test_a_time_finer_than_a_microsecond_is_rounded_to_it() -> None:
    raw = json.dumps(dict(GOOD, time="2026-12-04T04:24:18.9999996Z")).encode()
    fast = DECODER.decode(raw)
    assert fast is not None and fast.time == datetime(2026, 12, 4, 4, 24, 19, tzinfo=UTC)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PATHS), ODD), max_size=3))
def test_what_the_mirror_accepts_the_model_accepts_with_the_same_values(
    changes: list[tuple[tuple[Any, ...], Any]],
) -> None:
    doc = json.loads(json.dumps(GOOD))
    for path, value in changes:
        try:
            _put(doc, path, copy.deepcopy(value))
        except (KeyError, IndexError, TypeError):
            continue  # the path no longer exists after an earlier change
    _same_outcome(json.dumps(doc).encode())


@pytest.mark.parametrize(
    "raw",
    [
        json.dumps(GOOD).encode(),
        b'{"schema_version":1,"device_id":"d","seq":1,"seq":0,"time":"2026-12-04T04:24:18Z",'
        b'"window_s":1}',
        b'{"schema_version":1,"device_id":"d","seq":0,"seq":1,"time":"2026-12-04T04:24:18Z",'
        b'"window_s":1}',
        b'{"schema_version":1,"device_id":"\\ud800","seq":1,"time":"2026-12-04T04:24:18Z",'
        b'"window_s":1}',
        b'{"schema_version":1,"device_id":"d","seq":1,"time":"2026-12-04T04:24:18Z",'
        b'"window_s":NaN}',
        b'{"schema_version":1,"device_id":"d","seq":1,"time":"2026-12-04T04:24:18Z",'
        b'"window_s":1} trailing',
        b"\xff\xfe",
        b"",
    ],
    ids=[
        "good",
        "duplicate key last bad",
        "duplicate key last good",
        "lone surrogate",
        "NaN",
        "trailing bytes",
        "not utf-8",
        "empty",
    ],
)
def test_edge_payloads_decode_as_the_model_decodes_them(raw: bytes) -> None:
    _same_outcome(raw)


def test_the_mirror_accepts_what_agents_send() -> None:
    raw = json.dumps(GOOD).encode()
    fast = DECODER.decode(raw)
    assert fast is not None
    assert fast.models[0].queue_depth == 3 and fast.device.memory_used_bytes == 2**40
    assert _builtins(fast) == _builtins(Telemetry.model_validate_json(raw))


def test_what_the_model_coerces_the_mirror_leaves_to_it() -> None:
    doc = dict(GOOD, seq="12")
    raw = json.dumps(doc).encode()
    assert DECODER.decode(raw) is None
    assert Telemetry.model_validate_json(raw).seq == 12


@pytest.mark.parametrize("model", [Telemetry, DeviceStatus, UpdateEvent])
def test_the_mirror_has_the_models_fields(model: type[BaseModel]) -> None:
    assert mirror(model).__struct_fields__ == tuple(model.model_fields)


def test_a_model_the_mirror_cannot_follow_is_refused_when_built() -> None:
    class Checked(BaseModel):
        name: str

        @field_validator("name")
        @classmethod
        def _lower(cls, value: str) -> str:
            return value.lower()

    class Aliased(BaseModel):
        model_config = ConfigDict(extra="allow")
        name: str = Field(alias="Name")

    for model in (Checked, Aliased):
        with pytest.raises(TypeError, match="cannot be mirrored"):
            mirror(model)


# -- with the telemetry tables' bounds (control_plane.ingest.ingestor.storable_bounds) ---------------

STORABLE = FastDecoder(Telemetry, storable_bounds())
EDGES: list[Any] = [
    2**31 - 1,
    2**31,
    -(2**31),
    -(2**31) - 1,
    2**63 - 1,
    2**63,
    -(2**63),
    -1,
    0,
    1.7976931348623157e308,
    "m" * 128,
    "m" * 129,
    None,
]
TABLE_PATHS = [p for p in PATHS if p[-1] not in ("extra", "models", "device", "accelerators")]
TABLE_PATHS += [("models", 0, "errors"), ("models", 0, "queue_depth"), ("device", "temperature_c")]


def test_what_passes_the_tables_bounds_is_stored_unchecked_as_the_checks_would_store_it() -> None:
    """Ingest stores what the bounded decoder accepts without the per-row checks: it accepts
    nothing those would refuse, and what it refuses is decided by the model and the checks."""
    accepted = refused = 0
    for path in TABLE_PATHS:
        for value in EDGES + ODD_VALUES:
            doc = json.loads(json.dumps(GOOD))
            _put(doc, path, copy.deepcopy(value))
            raw = json.dumps(doc).encode()
            fast = STORABLE.decode(raw)
            if fast is None:
                refused += 1
                continue
            accepted += 1
            _assert_same(_builtins(fast), _builtins(Telemetry.model_validate_json(raw)))
            device, *samples = telemetry_rows(fast, "2026-12-04 04:24:18.827846")
            assert unstorable_rows(DeviceSample.__table__, DEVICE_SAMPLE_COLUMNS, [device]) is None
            assert unstorable_rows(TelemetrySample.__table__, SAMPLE_COLUMNS, samples) is None
    assert accepted and refused  # both sides of the bounds were reached


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("seq",), 0),  # the model's own bound (ge=1), kept with the table's (ge=0)
        (("seq",), 2**63),
        (("models", 0, "requests"), -1),
        (("models", 0, "version"), 2**31),
        (("models", 0, "model"), "m" * 129),
        (("device", "memory_used_bytes"), 2**63),
        (("window_s",), 1e400),
        (("models", 0, "p99_ms"), -1e400),
    ],
    ids=str,
)
def test_the_tables_bounds_refuse_what_the_checks_refuse(path: tuple[Any, ...], value: Any) -> None:
    doc = json.loads(json.dumps(GOOD))
    _put(doc, path, value)
    assert STORABLE.decode(json.dumps(doc).encode()) is None
    assert STORABLE.decode(json.dumps(GOOD).encode()) is not None


def test_each_field_fills_the_column_of_its_name() -> None:
    """storable_bounds reads a field's limits from the column of the same name: the rows must
    put it there."""
    fast = STORABLE.decode(json.dumps(GOOD).encode())
    assert fast is not None
    device, *samples = telemetry_rows(fast, "then")
    rows = [(DEVICE_SAMPLE_COLUMNS, device), (SAMPLE_COLUMNS, samples[0])]
    sources = [(Telemetry, fast), (DeviceTelemetry, fast.device), (ModelTelemetry, fast.models[0])]
    checked = 0
    for model, _, columns in TELEMETRY_TABLES:
        row = next(r for names, r in rows if names == columns)
        source = next(s for m, s in sources if m is model)
        for name in columns:
            if name in model.model_fields and name != "time":
                assert row[columns.index(name)] == getattr(source, name), name
                checked += 1
    assert checked >= 15
