"""Import layouts: one module per layout, each a pure function ``read(rows, ctx)`` from rows
(:func:`grouppref.readers.rows.iter_rows`) to groups with rankings and rejects
(:class:`~grouppref.pipeline.imports.layouts.raw_groups.Imported`). :func:`detect` tells the
layout from the first row's columns; :func:`context` applies a layout's defaults to the
settings the user left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import Any

from grouppref.errors import InputFileError
from grouppref.pipeline.imports.config import LAYOUTS, ImportConfig
from grouppref.pipeline.imports.layouts import (
    arena,
    groups,
    helpsteer2,
    helpsteer3,
    hh,
    nectar,
    nectar_columns,
    oasst,
    pairs,
    responses,
    scores,
    ultrafeedback,
)
from grouppref.pipeline.imports.layouts.raw_groups import Context, Imported
from grouppref.readers.lines import LineRange, range_rows
from grouppref.readers.rows import Decoding, Row, maybe_json

READERS: dict[str, Callable[[Iterable[tuple[int, Row]], Context], Imported]] = {
    "groups": groups.read, "responses": responses.read, "ultrafeedback": ultrafeedback.read,
    "nectar": nectar.read, "helpsteer2": helpsteer2.read, "scores": scores.read,
    "pairs": pairs.read, "hh": hh.read, "oasst": oasst.read, "helpsteer3": helpsteer3.read,
    "arena": arena.read}
# the layouts of one row per group (their ONE_ROW_PER_GROUP, read_groups with merge=False): a
# row's group depends on no other row but through the grouper (a prompt read again, an id taken)
ONE_ROW_PER_GROUP = frozenset(name for name, module in {
    "nectar": nectar, "ultrafeedback": ultrafeedback}.items() if module.ONE_ROW_PER_GROUP)
DEFAULTS: dict[str, dict[str, Any]] = {
    "groups": groups.DEFAULTS, "responses": responses.DEFAULTS,
    "ultrafeedback": ultrafeedback.DEFAULTS, "nectar": nectar.DEFAULTS,
    "helpsteer2": helpsteer2.DEFAULTS, "scores": scores.DEFAULTS, "pairs": pairs.DEFAULTS,
    "hh": hh.DEFAULTS, "oasst": oasst.DEFAULTS, "helpsteer3": helpsteer3.DEFAULTS,
    "arena": arena.DEFAULTS}


def read_range(path: Path, part: LineRange, decoding: Decoding, ctx: Context) -> Imported:
    """The lines ``part`` of the JSON Lines file ``path`` read by ``ctx``'s layout, their
    decoding counted in ``decoding``: over columns where the layout and settings allow
    (:func:`.nectar_columns.applies`), else row by row."""
    if nectar_columns.applies(ctx):
        return nectar_columns.read_range(path, part, decoding, ctx)
    return READERS[ctx.layout](range_rows(path, part, decoding), ctx)


def detect(row: dict[str, Any], config: ImportConfig, source: str) -> str:
    """The layout of a row, from its columns (the first match of docs/import.md's table).

    Raises:
        InputFileError: no layout fits; the message lists the row's columns and the layouts.
    """
    keys = set(row)
    m = config.mapping
    prompt_given = any(c in keys and row[c] not in (None, "", []) for c in (m.text, m.messages))
    if "candidates" in keys:
        return "groups"
    if {"message_id", "parent_id", "role"} <= keys or (
            oasst.is_tree(row) and isinstance(maybe_json(row["prompt"]), dict)):
        return "oasst"
    if {"response1", "response2", "overall_preference"} <= keys:
        return "helpsteer3"
    if {"model_a", "model_b", "winner", "conversation_a", "conversation_b"} <= keys:
        return "arena"
    if "completions" in keys:
        return "ultrafeedback"
    if "answers" in keys:
        return "nectar"
    if {config.chosen, config.rejected} <= keys:
        return "pairs" if prompt_given or not isinstance(row[config.chosen], str) else "hh"
    if set(helpsteer2.ATTRIBUTES[:3]) <= keys and "response" in keys:
        return "helpsteer2"
    if m.responses in keys or m.response in keys:
        return "responses"
    raise InputFileError(f"{source}: cannot tell the layout from the first row's columns "
                         f"{sorted(keys)[:12]}; give --layout (one of {', '.join(LAYOUTS)})")


def peek(rows: Iterator[tuple[int, Row]]) -> tuple[dict[str, Any] | None,
                                                   Iterator[tuple[int, Row]]]:
    """The first row that is an object (``None``: there is none), and all the rows again."""
    seen: list[tuple[int, Row]] = []
    for item in rows:
        seen.append(item)
        if isinstance(item[1], dict):
            return item[1], chain(seen, rows)
    return None, iter(seen)


def context(config: ImportConfig, layout: str, source: str, stage: str) -> Context:
    """The settings a layout reads with: its defaults where the user gave nothing."""
    defaults = DEFAULTS[layout]
    given = config.mapping.model_fields_set
    mapping = config.mapping.model_copy(update={
        k: v for k, v in defaults.get("mapping", {}).items() if k not in given})
    return Context(
        config=config, mapping=mapping, source=source, stage=stage, layout=layout,
        annotator=config.annotator or layout,
        kind=config.annotator_kind or defaults.get("kind", "human"),
        text_key=config.text_key or defaults.get("text_key", "text"),
        scores=list(config.scores or defaults.get("scores", [])))
