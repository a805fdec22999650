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

import hashlib
import json
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from functools import cache
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

if typing.TYPE_CHECKING:
    import datasets
    import pyarrow as pa

R = TypeVar("R", bound=BaseModel)



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


# The Arrow type and the ``datasets`` feature (in its serialized form, what ``Features.to_dict``
# gives and ``dataset_info.json`` holds) of each scalar annotation; ``datasets`` itself is not
# imported for them, so that a stage writes and reads its run folder without it (its import
# is 1.6 CPU-s of a stage's fixed cost). tests/unit/schemas holds both equal to ``datasets``'.
_VALUES: dict[Any, str] = {str: "string", bool: "bool", int: "int64", float: "float64",
                           datetime: "string"}


def _feature(annotation: Any) -> Any:
    """The serialized ``datasets`` feature of an annotation: ``{"dtype": ..., "_type":
    "Value"}``, ``{"feature": ..., "_type": "List"}``, or a dict of a model's fields."""
    ann = _unwrap(annotation)
    if isinstance(ann, list):
        raise TypeError(f"union {ann} has no Arrow feature; wrap it in a dict field")
    origin = typing.get_origin(ann)
    if origin is Literal or origin is dict:
        return {"dtype": "string", "_type": "Value"}
    if ann in _VALUES:
        return {"dtype": _VALUES[ann], "_type": "Value"}
    if origin is list:
        return {"feature": _feature(typing.get_args(ann)[0]), "_type": "List"}
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return {name: _feature(f.annotation) for name, f in ann.model_fields.items()}
    raise TypeError(f"no Arrow feature for annotation {ann!r}")


def _arrow_type(feature: dict[str, Any]) -> pa.DataType:
    """The Arrow type ``datasets`` gives a serialized feature of :func:`_feature`."""
    import pyarrow as pa

    if feature.get("_type") == "Value":
        return pa.type_for_alias(feature["dtype"])
    if feature.get("_type") == "List":
        return pa.list_(_arrow_type(feature["feature"]))
    return pa.struct([pa.field(name, _arrow_type(f)) for name, f in feature.items()])


@cache
def feature_dict_for(model: type[BaseModel]) -> dict[str, Any]:
    """A record type's ``datasets`` features in serialized form (one entry per top-level
    field): what ``features_for(model).to_dict()`` gives, made without ``datasets``."""
    return {name: _feature(f.annotation) for name, f in model.model_fields.items()}


@cache
def features_for(model: type[BaseModel]) -> datasets.Features:
    """The ``datasets.Features`` of a record type (one column per top-level field)."""
    import datasets  # here, not at import: the CLI's help and schema commands stay light

    return datasets.Features.from_dict(feature_dict_for(model))


@cache
def arrow_schema_for(model: type[BaseModel]) -> pa.Schema:
    """The Arrow schema of :func:`features_for`, with the ``huggingface`` metadata that
    ``Features.arrow_schema`` gives it (made once per record type, without ``datasets``)."""
    import pyarrow as pa

    features = feature_dict_for(model)
    fields = [pa.field(name, _arrow_type(f)) for name, f in features.items()]
    return pa.schema(fields).with_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})})


def stored_as(schema: pa.Schema, model: type[BaseModel]) -> bool:
    """A table of this schema holds rows in ``model``'s own stored form (the columns and
    types of :func:`arrow_schema_for`; metadata aside)."""
    return schema.equals(arrow_schema_for(model))


# Converters are compiled once per record type from the annotations: a function per field
# that needs one (a dict stored as JSON text, or a list / nested model holding such a dict);
# every other value is stored as it is, so most of a row is copied at C speed (``dict(row)``).
Convert = Callable[[Any], Any]


_DUMPS = json.JSONEncoder(sort_keys=True, ensure_ascii=False).encode  # json.dumps(...), made once


def json_text(value: object) -> str | None:
    """A dict field's stored form: canonical JSON text (``None`` stays ``None``)."""
    if value is None:
        return None
    return "{}" if value == {} else _DUMPS(value)  # most metadata and params are empty


_json_dump: Convert = json_text


def _json_load(value: Any) -> Any:
    # stored as JSON text; a row read from a JSON file holds the dict
    if not isinstance(value, str):
        return value
    return {} if value == "{}" else json.loads(value)


def _list_of(item: Convert) -> Convert:
    def convert(value: Any) -> Any:  # a value of the wrong shape is left for pydantic to name
        return [item(v) for v in value] if isinstance(value, list) else value
    return convert


def _fields_of(model: type[BaseModel], field: Callable[[Any], Convert | None],
               keep_unknown: bool) -> Convert | None:
    """A converter of a model's dict form (``None``: none needed); ``field`` compiles one per
    annotation. Without ``keep_unknown`` a key the model does not have is dropped (as the
    nested rows of a plain JSON file are read)."""
    names = frozenset(model.model_fields)
    plan = [(n, c) for n, f in model.model_fields.items() if (c := field(f.annotation))]
    if not plan and keep_unknown:
        return None
    if not plan:
        return lambda value: (value if not isinstance(value, dict) or value.keys() <= names
                              else {n: v for n, v in value.items() if n in names})

    def convert(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = dict(value) if keep_unknown or value.keys() <= names else {
            n: v for n, v in value.items() if n in names}
        for name, c in plan:
            if name in out:  # a key a plain JSON row leaves out keeps its default
                out[name] = c(out[name])
        return out
    return convert


def _compile(annotation: Any, json_convert: Convert, keep_unknown: bool) -> Convert | None:
    ann = _unwrap(annotation)
    origin = typing.get_origin(ann)
    if origin is dict:
        return json_convert
    if origin is list:
        item = _compile(typing.get_args(ann)[0], json_convert, keep_unknown)
        return None if item is None else _list_of(item)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return _fields_of(ann, lambda a: _compile(a, json_convert, keep_unknown), keep_unknown)
    return None


@cache
def _encoder(model: type[BaseModel]) -> Convert:
    # model_dump gives exactly the fields: a nested model without dict fields is kept as is
    encode = _fields_of(model, lambda a: _compile(a, _json_dump, True), keep_unknown=True)
    return encode or dict


@cache
def _decoder(model: type[BaseModel]) -> Convert:
    decode = _fields_of(model, lambda a: _compile(a, _json_load, False), keep_unknown=True)
    return decode or dict


@cache
def _stored_decoder(model: type[BaseModel]) -> Convert:
    # an Arrow struct holds exactly its fields: nothing to drop, only dict fields to parse
    decode = _fields_of(model, lambda a: _compile(a, _json_load, True), keep_unknown=True)
    return decode or dict


def to_row(record: BaseModel) -> dict[str, Any]:
    """A record as an Arrow-ready row (matching :func:`features_for`)."""
    return _encoder(type(record))(record.model_dump(mode="json"))


def from_row(model: type[R], row: dict[str, Any]) -> R:
    """Rebuild and re-validate a record from a row written by :func:`to_row` (a key the model
    does not have is kept, so that ``extra="forbid"`` names it)."""
    return model.model_validate(_decoder(model)(row))


def from_stored_row(model: type[R], row: dict[str, Any]) -> R:
    """:func:`from_row` of a row read from a table with :func:`features_for`'s schema (its
    nested structs hold exactly their fields, so no unknown key is looked for there)."""
    return model.model_validate(_stored_decoder(model)(row))


def table_rows(table: pa.Table, batch_size: int = 1024) -> Iterator[dict[str, Any]]:
    """The rows of an Arrow table as Python dicts, converted a batch at a time (column-wise,
    in C) rather than value by value; at most one batch of dicts is alive at once."""
    for batch in table.to_batches(max_chunksize=batch_size):
        yield from batch.to_pylist()


def arrow_table(ds: datasets.Dataset) -> pa.Table:
    """The rows of ``ds``, in order, as one Arrow table, through ``datasets``' own Arrow
    formatting (public API): the dataset's table itself (zero-copy) when ``ds`` is a whole
    table, the selected rows taken when it is a selection of another (``select``,
    ``shuffle``, ``filter`` keep an indices mapping over the original)."""
    return ds.with_format("arrow")[:]


def take_rows(table: pa.Table, indices: Sequence[int]) -> pa.Table:
    """Rows ``indices`` (0-based, any order) of ``table``: the range they span is sliced first
    (zero-copy) and the rows taken from it. ``Table.take`` on a table of many chunks costs
    the size of the whole table, not of the rows taken (2.8 CPU-s for 1,000 rows of a
    200,000-row, 200-chunk table, against 3 ms through the slice), so a stage that takes one
    shard at a time would grow with the square of its input."""
    if not indices:
        return table.slice(0, 0)
    lo, hi = min(indices), max(indices)
    if hi - lo + 1 == len(indices) and list(indices) == list(range(lo, hi + 1)):
        return table.slice(lo, len(indices))
    return table.slice(lo, hi - lo + 1).take([i - lo for i in indices])


def to_table(records: typing.Iterable[BaseModel], model: type[BaseModel]) -> pa.Table:
    """Records of one type as one Arrow table with the schema of :func:`features_for`."""
    return rows_table([to_row(r) for r in records], model)


def rows_table(rows: typing.Sequence[typing.Mapping[str, object]],
               model: type[BaseModel]) -> pa.Table:
    """Rows already in stored form (what :func:`to_row` gives for records of ``model``) as one
    Arrow table with the schema of :func:`features_for`. Converted as one struct array (each
    row once, 0.27 CPU-s for 10,000 Nectar-sized groups) rather than by ``from_pylist`` (column
    by column over the rows, 0.43 CPU-s): the same table."""
    import pyarrow as pa

    schema = arrow_schema_for(model)
    table = pa.Table.from_struct_array(pa.array(list(rows), type=pa.struct(schema)))
    return table.replace_schema_metadata(schema.metadata)


def to_dataset(records: typing.Iterable[BaseModel], model: type[BaseModel]) -> datasets.Dataset:
    """A ``datasets.Dataset`` of records of one type (an empty one keeps the schema)."""
    import datasets

    features = features_for(model)
    return datasets.Dataset(to_table(records, model), info=datasets.DatasetInfo(features=features))


def table_dataset(table: pa.Table, info: datasets.DatasetInfo, key: str) -> datasets.Dataset:
    """``datasets.Dataset(table, info=info)`` with its fingerprint made from ``key`` (text that
    identifies the table's content, e.g. a hash of the files it was read from) instead of
    datasets' own: that one pickles and hashes every byte of the table (1.8 CPU-s for a
    400 MB table). The fingerprint names datasets' cache files and is kept in ``state.json``
    by ``save_to_disk``; a key of the content keeps it deterministic."""
    import datasets

    fingerprint = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    return datasets.Dataset(table, info=info, fingerprint=fingerprint)


def from_table(table: pa.Table, model: type[R]) -> list[R]:
    """Every row of ``table`` as a validated record (e.g. a stage's ``data/``, read without
    ``datasets``)."""
    parse = from_stored_row if stored_as(table.schema, model) else from_row
    return [parse(model, row) for row in table_rows(table)]


def from_dataset(ds: datasets.Dataset, model: type[R]) -> list[R]:
    """Every row of ``ds`` as a validated record (:func:`from_table` of its rows)."""
    return from_table(arrow_table(ds), model)

