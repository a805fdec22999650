"""Records <-> Arrow rows (``datasets.Features``), losslessly.

The mapping is derived from the pydantic annotations, so a new field needs no code here:

==========================  ===============================================
pydantic annotation          Arrow feature
==========================  ===============================================
``str``, ``Literal[...]``    ``Value("string")``
``int`` / ``float`` / bool   ``Value("int64")`` / ``Value("float64")`` / bool
``datetime``                 ``Value("string")`` (ISO 8601 with time zone)
``list[X]``                  ``List(feature(X))``
nested ``BaseModel``         a struct of its fields
``dict[...]``                ``Value("string")`` holding canonical JSON
==========================  ===============================================

Free-form maps are JSON because their values mix types (str/int/float) and Arrow columns
cannot; JSON keeps ``1`` and ``1.0`` apart, so the round trip model -> row -> model is exact.
"""

from __future__ import annotations

import json
import types
import typing
from datetime import datetime
from functools import cache
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

if typing.TYPE_CHECKING:
    import datasets

R = TypeVar("R", bound=BaseModel)

_JSON = "json"


def _unwrap(annotation: Any) -> Any:
    """Strip ``Annotated`` and ``Optional`` so only the value type is left."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) == 1:
                annotation = args[0]
                continue
            return args  # a union of scalars: only allowed inside dicts
        return annotation


def _feature(annotation: Any) -> Any:
    import datasets  # here, not at import: the CLI's help and schema commands stay light

    ann = _unwrap(annotation)
    if isinstance(ann, list):
        raise TypeError(f"union {ann} has no Arrow feature; wrap it in a dict field")
    origin = typing.get_origin(ann)
    if ann is str or origin is Literal:
        return datasets.Value("string")
    if ann is bool:
        return datasets.Value("bool")
    if ann is int:
        return datasets.Value("int64")
    if ann is float:
        return datasets.Value("float64")
    if ann is datetime:
        return datasets.Value("string")
    if origin is list:
        return datasets.List(_feature(typing.get_args(ann)[0]))
    if origin is dict:
        return datasets.Value("string")
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return {name: _feature(f.annotation) for name, f in ann.model_fields.items()}
    raise TypeError(f"no Arrow feature for annotation {ann!r}")


@cache
def features_for(model: type[BaseModel]) -> datasets.Features:
    """The ``datasets.Features`` of a record type (one column per top-level field)."""
    import datasets

    return datasets.Features(
        {name: _feature(f.annotation) for name, f in model.model_fields.items()}
    )


# A codec is a small plan compiled once per annotation: "json" (a dict stored as JSON text),
# ("list", item_codec), ("model", {field: codec}) or None (stored as is).
Codec = Any


def _codec(annotation: Any) -> Codec:
    ann = _unwrap(annotation)
    origin = typing.get_origin(ann)
    if origin is dict:
        return _JSON
    if origin is list:
        item = _codec(typing.get_args(ann)[0])
        return None if item is None else ("list", item)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ("model", _model_codec(ann))
    return None


@cache
def _model_codec(model: type[BaseModel]) -> dict[str, Codec]:
    return {name: _codec(f.annotation) for name, f in model.model_fields.items()}


def _encode(codec: Codec, value: Any) -> Any:
    if value is None or codec is None:
        return value
    if codec == _JSON:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    kind, inner = codec
    if kind == "list":
        return [_encode(inner, v) for v in value]
    return {n: _encode(c, value.get(n)) for n, c in inner.items()}


def _decode(codec: Codec, value: Any) -> Any:
    if value is None or codec is None:
        return value
    if codec == _JSON:  # stored as JSON text; a row read from a JSON file holds the dict
        return json.loads(value) if isinstance(value, str) else value
    kind, inner = codec
    if kind == "list":  # a value of the wrong shape is left for pydantic to name
        return [_decode(inner, v) for v in value] if isinstance(value, list) else value
    if not isinstance(value, dict):
        return value
    # a key a plain JSON row leaves out keeps its default (a stored row has every key)
    return {n: _decode(c, value[n]) for n, c in inner.items() if n in value}


def to_row(record: BaseModel) -> dict[str, Any]:
    """A record as an Arrow-ready row (matching :func:`features_for`)."""
    dumped = record.model_dump(mode="json")
    return {name: _encode(c, dumped.get(name)) for name, c in _model_codec(type(record)).items()}


def from_row(model: type[R], row: dict[str, Any]) -> R:
    """Rebuild and re-validate a record from a row written by :func:`to_row`."""
    codecs = _model_codec(model)
    unknown = set(row) - set(codecs)
    data = {name: _decode(c, row[name]) for name, c in codecs.items() if name in row}
    data.update({name: row[name] for name in unknown})  # let extra="forbid" name them
    return model.model_validate(data)


def to_dataset(records: typing.Iterable[BaseModel], model: type[BaseModel]) -> datasets.Dataset:
    """A ``datasets.Dataset`` of records of one type (an empty one keeps the schema)."""
    import datasets

    rows = [to_row(r) for r in records]
    features = features_for(model)
    if not rows:
        return datasets.Dataset.from_dict({k: [] for k in features}, features=features)
    return datasets.Dataset.from_list(rows, features=features)


def from_dataset(ds: datasets.Dataset, model: type[R]) -> list[R]:
    """Every row of ``ds`` as a validated record."""
    return [from_row(model, row) for row in ds]
