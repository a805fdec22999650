"""Render the data-format reference (docs/data-format.md) from the record schemas.

Run ``python -m grouppref.schemas.docs > docs/data-format.md``; a test checks the file is current.
"""

from __future__ import annotations

from typing import Any

from grouppref.schemas.arrow import features_for
from grouppref.schemas.records import RECORD_TYPES

HEADER = """# Data format reference

Generated from `grouppref/schemas/records.py` by `python -m grouppref.schemas.docs`; do not
edit by hand. Every record rejects unknown keys and non-finite numbers. Stage outputs are
`datasets.Dataset`s with one row per group; free-form maps (metadata, scores, strengths,
sampling parameters) are stored in Arrow as canonical JSON strings so that the round trip
model -> Arrow row -> model is exact. `grouppref schema NAME` prints the JSON Schema.

**Input files** (prompts, `generate --import`, `grouppref import`, `train` on a file): JSONL,
JSON, CSV, TSV and Parquet files, the text ones also compressed (`.gz`, `.bz2`, `.xz`; `.zst`
with the `zstandard` package), saved datasets (`save_to_disk`), folders of data files in the
Hub's layout (`data/train-00000-of-00001.parquet`, `test.jsonl`, ...; `--split` picks one)
and Hub ids. As in `datasets`, the content decides between JSON Lines and one JSON list
(`.json` holding JSON Lines is read line by line). Text files must be UTF-8; a UTF-8
byte-order mark is dropped (so a BOM-prefixed CSV header is recognised), and so is one at the
start of a YAML/TOML/JSON config. A file that is not UTF-8 text at all (binary, UTF-16/32,
or one no line of which decodes) stops with one line naming the first bad byte and exit code
2; in a file that is, a line that does not decode is a reject (file, row, reason) and the
rest is read. A blank line is counted as a row and rejected as "blank line (skipped)". One
`prompt_id` names one prompt: a later row giving it to a different prompt is rejected
("duplicate prompt_id ... first seen at row N"), or both rows are with `--duplicate-ids
reject_all`. Every reject names its file (or stage) and row. A JSON line nested deeper than
Python decodes, or holding a number of more than 4300 digits, is a reject like any invalid
JSON. A CSV field may be of any length; a CSV header that names a column twice stops with one
line.

**Partial rankings.** A `Ranking` may name a subset (at least two) of its group's
candidates: an "N/A" rating, a pairwise comparison. Aggregation uses only the comparisons a
ranking makes; a group whose comparisons do not link every candidate is flagged
`disconnected` (docs/aggregate.md).
"""


def _type_text(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_type_text(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " / ".join(repr(v) for v in schema["enum"])
    if "const" in schema:
        return repr(schema["const"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list[{_type_text(schema.get('items', {}))}]"
    if kind == "object":
        extra = schema.get("additionalProperties")
        return f"dict[str, {_type_text(extra)}]" if isinstance(extra, dict) else "object"
    return str(kind)


def _limits(schema: dict[str, Any]) -> str:
    keys = ("minimum", "maximum", "minItems", "maxItems", "minLength", "maxLength", "pattern")
    return ", ".join(f"{k}={schema[k]}" for k in keys if k in schema)


def render() -> str:
    """The whole reference as Markdown."""
    lines = [HEADER]
    for name, cls in RECORD_TYPES.items():
        schema = cls.model_json_schema()
        lines += [f"## {name}", "", (cls.__doc__ or "").strip().splitlines()[0], "",
                  "| field | type | required | limits | description |",
                  "| --- | --- | --- | --- | --- |"]
        required = set(schema.get("required", []))
        for field, prop in schema["properties"].items():
            description = (cls.model_fields[field].description or "").replace("|", "\\|")
            lines.append(f"| `{field}` | {_type_text(prop)} | {'yes' if field in required else ''}"
                         f" | {_limits(prop)} | {description} |")
        arrow = ", ".join(f"`{k}`: {type(v).__name__ if isinstance(v, dict) else v}"
                          for k, v in features_for(cls).items())
        lines += ["", f"Arrow: {arrow}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
