"""A fast first decoder for the device messages the whole fleet sends all the time (telemetry).

The wire's one definition stays the pydantic model in :mod:`common.protocol.messages`; this
module generates a msgspec mirror of it (same fields, types, defaults, bounds and refusal of
unknown fields) and decodes with that first. What the mirror refuses goes to the model itself,
which decides: pydantic's lax conversions (``"12"`` for an int, a number for a datetime) and its
error messages are kept, and only what both accept costs the mirror's price. Measured in the
fleet benchmark's ingest path (one telemetry message: JSON to a validated object), 0.9 us
against pydantic's 3.7.

A model the mirror cannot follow exactly (a validator, an alias, a constraint it does not know)
is refused when the mirror is built, not approximated. ``bounds`` add limits of the mirror's
own (what a database column holds, say): what passes the mirror then needs no further check,
and what only they refuse goes to the model, like everything else the mirror refuses.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from datetime import datetime
from enum import Enum
from typing import Any, Generic, Literal, TypeVar, Union, cast

import annotated_types as at
import msgspec
from pydantic import BaseModel
from pydantic.fields import FieldInfo

M = TypeVar("M", bound=BaseModel)

_SCALARS: tuple[type, ...] = (str, int, float, bool, datetime)
_BOUNDS = {at.Ge: "ge", at.Gt: "gt", at.Le: "le", at.Lt: "lt"}
_LENGTHS = {at.MinLen: "min_length", at.MaxLen: "max_length"}
_TIGHTER = {"ge": max, "gt": max, "min_length": max, "le": min, "lt": min, "max_length": min}
Bounds = Mapping[type[BaseModel], Mapping[str, Mapping[str, Any]]]
"""Per model, per field: limits as msgspec.Meta takes them (``ge``, ``lt``, ``max_length``...)."""


def tighten(limits: dict[str, Any], key: str, value: Any) -> None:
    """Add the limit ``key`` (a msgspec.Meta keyword) to ``limits``, keeping the tighter of two."""
    limits[key] = _TIGHTER[key](limits[key], value) if key in limits else value


class FastDecoder(Generic[M]):
    """Decodes JSON into an object with the attributes of ``model``'s instances (nested models
    too), or returns None where the mirror refuses it and the model must decide."""

    def __init__(self, model: type[M], bounds: Bounds | None = None) -> None:
        self.model = model
        self._decoder = msgspec.json.Decoder(mirror(model, bounds))

    def decode(self, payload: bytes) -> M | None:
        try:
            # The mirror's instances stand for the model's: same attribute names and values.
            return cast(M, self._decoder.decode(payload))
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None


def mirror(model: type[BaseModel], bounds: Bounds | None = None) -> type[msgspec.Struct]:
    """The msgspec Struct type that accepts what ``model`` accepts strictly, within ``bounds``;
    raises TypeError for a model it cannot follow exactly."""
    for kind, limits in (bounds or {}).items():
        if unknown := set(limits) - set(kind.model_fields):
            raise TypeError(f"{kind.__name__} has no fields {sorted(unknown)}")
    return _mirror(model, bounds or {}, {})


def _mirror(
    model: type[BaseModel], bounds: Bounds, done: dict[type, type[msgspec.Struct]]
) -> type[msgspec.Struct]:
    if model in done:
        return done[model]
    decorators = model.__pydantic_decorators__
    if any((decorators.validators, decorators.field_validators, decorators.root_validators)) or any(
        (decorators.model_validators, decorators.computed_fields)
    ):
        raise TypeError(f"{model.__name__}: validators cannot be mirrored")
    extra = model.model_config.get("extra") or "ignore"
    if extra == "allow":
        raise TypeError(f"{model.__name__}: extra='allow' cannot be mirrored")
    limits = bounds.get(model, {})
    fields = [
        (name, _field_type(model, name, info, limits.get(name, {}), bounds, done), _default(info))
        for name, info in model.model_fields.items()
    ]
    struct = msgspec.defstruct(
        f"{model.__name__}Mirror",
        fields,
        kw_only=True,
        forbid_unknown_fields=extra == "forbid",
        # decoded JSON holds no reference cycles: untracked instances do not count towards
        # the collector's next run, nor are they scanned by it
        gc=False,
    )
    done[model] = struct
    return struct


def _default(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return msgspec.field(default_factory=cast(Any, info.default_factory))
    if info.is_required():
        return msgspec.NODEFAULT
    if isinstance(info.default, list | dict | set):
        raise TypeError("a mutable default cannot be mirrored (use a default_factory)")
    return info.default


def _field_type(
    model: type[BaseModel],
    name: str,
    info: FieldInfo,
    limits: Mapping[str, Any],
    bounds: Bounds,
    done: dict[type, type[msgspec.Struct]],
) -> Any:
    where = f"{model.__name__}.{name}"
    if info.alias is not None or info.validation_alias is not None:
        raise TypeError(f"{where}: aliases cannot be mirrored")
    meta: dict[str, Any] = dict(limits)
    for item in info.metadata:
        if (key := _BOUNDS.get(type(item)) or _LENGTHS.get(type(item))) is not None:
            tighten(meta, key, getattr(item, key))
        elif (pattern := getattr(item, "pattern", None)) is not None and not (
            set(vars(item)) - {"pattern"}
        ):
            meta["pattern"] = pattern
        else:
            raise TypeError(f"{where}: constraint {item!r} cannot be mirrored")
    kind = _type(info.annotation, where, bounds, done)
    if not meta:
        return kind
    if typing.get_origin(kind) is Union:  # limits apply to the values, not to null
        return Union[  # noqa: UP007 (built from a tuple)
            tuple(
                a if a is type(None) else typing.Annotated[a, msgspec.Meta(**meta)]
                for a in typing.get_args(kind)
            )
        ]
    return typing.Annotated[kind, msgspec.Meta(**meta)]


def _type(kind: Any, where: str, bounds: Bounds, done: dict[type, type[msgspec.Struct]]) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any or kind is None or kind is type(None) or kind in _SCALARS:
        return kind
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return _mirror(kind, bounds, done)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind
    if origin is Literal:
        return kind
    if origin in (Union, types.UnionType):
        return Union[tuple(_type(a, where, bounds, done) for a in args)]  # noqa: UP007 (built from a tuple)
    if origin is list:
        return list[_type(args[0], where, bounds, done)]  # type: ignore[misc]
    if origin is dict and args[0] is str:
        return dict[str, _type(args[1], where, bounds, done)]  # type: ignore[misc]
    raise TypeError(f"{where}: type {kind!r} cannot be mirrored")
