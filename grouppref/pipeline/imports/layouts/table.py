"""Imported groups gathered column by column into the Arrow table ``import`` writes: the table
:func:`grouppref.schemas.arrow.rows_table` gives for the groups' stored rows (``to_row`` of
each :class:`~grouppref.schemas.AnnotatedGroup`), built from plain values without a dict per
group, candidate and ranking.

Why by hand: making each group's nested dicts and converting them (``rows_table``) cost a fifth
of an import of 50,000 Nectar rows, and the values are already known one by one (hashed ids,
texts the build checked, tiers it ordered). A group goes in column by column only where
:func:`~.stored.sure_values` vouches for every value the models would check; any other group
is made through the models (``add_row``), in its place. ``tests/unit/pipeline/imports/
test_stored_rows.py`` holds the table equal to ``rows_table`` of ``to_row``'s rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from grouppref.pipeline.imports.layouts.stored import (
    PROMPT_BY_HAND,
    GroupRow,
    PlainRanking,
    row_stats,
    sure_values,
    time_text,
)
from grouppref.schemas import AnnotatedGroup, Prompt
from grouppref.schemas.arrow import arrow_schema_for, json_text, rows_table

if TYPE_CHECKING:
    import pyarrow as pa


class _Columns:
    """The values of the groups added since the last table, one list per leaf column; list
    columns as offsets into their values."""

    def __init__(self) -> None:
        self.group_ids: list[str] = []
        self.prompt_ids: list[str] = []
        self.message_offsets: list[int] = [0]
        self.no_messages: list[bool] = []
        self.roles: list[str] = []
        self.contents: list[str] = []
        self.texts: list[str | None] = []
        self.references: list[str | None] = []
        self.prompt_metadata: list[str | None] = []
        self.candidate_offsets: list[int] = [0]
        self.candidate_ids: list[str] = []
        self.candidate_texts: list[str] = []
        self.models: list[str | None] = []
        self.ranking_offsets: list[int] = [0]
        self.annotators: list[str] = []
        self.kinds: list[str] = []
        self.ranking_groups: list[str] = []
        self.tier_offsets: list[int] = [0]
        self.tier_ids_offsets: list[int] = [0]
        self.tier_ids: list[str] = []
        self.scores: list[str | None] = []
        self.notes: list[str | None] = []
        self.created: list[str] = []

    def table(self) -> pa.Table:
        import pyarrow as pa

        def text(values: Sequence[str | None]) -> pa.Array:
            return pa.array(values, pa.string())

        def offsets(values: list[int]) -> pa.Array:
            return pa.array(values, pa.int32())

        return stored_table(
            text(self.group_ids),
            prompts_array(text(self.prompt_ids), offsets(self.message_offsets),
                          text(self.roles), text(self.contents),
                          pa.array(self.no_messages, pa.bool_()), text(self.texts),
                          text(self.references), text(self.prompt_metadata)),
            candidates_array(offsets(self.candidate_offsets), text(self.candidate_ids),
                             text(self.candidate_texts), text(self.models)),
            rankings_array(offsets(self.ranking_offsets), text(self.annotators),
                           text(self.kinds), text(self.ranking_groups),
                           offsets(self.tier_offsets), offsets(self.tier_ids_offsets),
                           text(self.tier_ids), text(self.scores), text(self.notes),
                           text(self.created)))


# The stored table's columns from Arrow arrays (:class:`_Columns` from its lists, the columnar
# Nectar read from its input's columns): list columns as int32 offsets into their values.
def prompts_array(prompt_ids: pa.Array, message_offsets: pa.Array, roles: pa.Array,
                  contents: pa.Array, no_messages: pa.Array | None, texts: pa.Array,
                  references: pa.Array, metadata: pa.Array) -> pa.Array:
    """The ``prompt`` column (``no_messages``: the prompts given as text; ``None``: none)."""
    import pyarrow as pa

    prompt_type = arrow_schema_for(AnnotatedGroup).field("prompt").type
    message_type = prompt_type.field("messages").type
    messages = pa.ListArray.from_arrays(
        message_offsets, pa.StructArray.from_arrays([roles, contents],
                                                    fields=list(message_type.value_type)),
        type=message_type, mask=no_messages)
    return pa.StructArray.from_arrays([prompt_ids, messages, texts, references, metadata],
                                      fields=list(prompt_type))


def candidates_array(offsets: pa.Array, ids: pa.Array, texts: pa.Array,
                     models: pa.Array) -> pa.Array:
    """The ``candidates`` column of imported candidates (source ``import``, the model)."""
    import pyarrow as pa

    list_type = arrow_schema_for(AnnotatedGroup).field("candidates").type
    item = list_type.value_type
    source = item.field("source").type
    n = len(ids)
    sources = pa.StructArray.from_arrays([
        pa.repeat("import", n), models, pa.repeat("{}", n),
        pa.nulls(n, source.field("seed").type)], fields=list(source))
    items = pa.StructArray.from_arrays([
        ids, texts, sources, pa.nulls(n, item.field("num_tokens").type),
        pa.nulls(n, item.field("behavior_logp").type)], fields=list(item))
    return pa.ListArray.from_arrays(offsets, items, type=list_type)


def rankings_array(offsets: pa.Array, annotators: pa.Array, kinds: pa.Array,
                   groups: pa.Array, tier_offsets: pa.Array, tier_ids_offsets: pa.Array,
                   tier_ids: pa.Array, scores: pa.Array, notes: pa.Array,
                   created: pa.Array) -> pa.Array:
    """The ``rankings`` column (annotators by id and kind; tiers as offsets of offsets)."""
    import pyarrow as pa

    list_type = arrow_schema_for(AnnotatedGroup).field("rankings").type
    item = list_type.value_type
    tiers_type = item.field("tiers").type
    n = len(annotators)
    annotator = pa.StructArray.from_arrays([annotators, kinds, pa.nulls(n, pa.string()),
                                            pa.nulls(n, pa.string())],
                                           fields=list(item.field("annotator").type))
    tiers = pa.ListArray.from_arrays(
        tier_offsets, pa.ListArray.from_arrays(tier_ids_offsets, tier_ids,
                                               type=tiers_type.value_type), type=tiers_type)
    items = pa.StructArray.from_arrays([annotator, groups, tiers, scores, notes, created],
                                       fields=list(item))
    return pa.ListArray.from_arrays(offsets, items, type=list_type)


def stored_models(table: pa.Table) -> set[str]:
    """The models the candidates of stored rows name."""
    import pyarrow.compute as pc

    candidates = pc.list_flatten(table.column("candidates"))
    models = pc.struct_field(pc.struct_field(candidates, "source"), "model")
    return {m for m in pc.unique(models).to_pylist() if m}


def stored_table(group_ids: pa.Array, prompts: pa.Array, candidates: pa.Array,
                 rankings: pa.Array) -> pa.Table:
    """The stored rows' table of these columns."""
    import pyarrow as pa

    return pa.Table.from_arrays([group_ids, prompts, candidates, rankings],
                                schema=arrow_schema_for(AnnotatedGroup))


class GroupTable:
    """Stored rows of imported groups, in the order added, as Arrow tables of at most
    ``chunk`` groups, with the counts the stage reports (rankings per annotator, partial
    rankings, candidates, models)."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.tables: list[pa.Table] = []
        self.annotators: Counter[str] = Counter()
        self.partial = self.candidates = 0
        self.models: set[str] = set()
        self._columns = _Columns()  # groups added from their values, not in a table yet
        self._rows: list[GroupRow] = []  # groups made through the models, not in a table yet

    def add(self, gid: str, prompt: Prompt, candidates: Sequence[tuple[str, str, str | None]],
            rankings: Sequence[PlainRanking], kind: str, when: datetime) -> bool:
        """Add the group ``gid`` (candidates as ``(id, text, model)``) from its values; ``False``
        (nothing added) when a value is one the checks here cannot vouch for (the caller then
        makes the group through the models and calls :meth:`add_row`)."""
        if not PROMPT_BY_HAND or not sure_values(candidates, rankings, kind):
            return False
        if self._rows:  # the table keeps the order the groups came in
            self.flush()
        c = self._columns
        c.group_ids.append(gid)
        c.prompt_ids.append(prompt.prompt_id)
        messages = prompt.messages
        c.no_messages.append(messages is None)
        for m in messages or ():
            c.roles.append(m.role)
            c.contents.append(m.content)
        c.message_offsets.append(len(c.roles))
        c.texts.append(prompt.text)
        c.references.append(prompt.reference)
        c.prompt_metadata.append(json_text(prompt.metadata))
        for cid, text, model in candidates:
            c.candidate_ids.append(cid)
            c.candidate_texts.append(text)
            c.models.append(model)
            if model:
                self.models.add(model)
        c.candidate_offsets.append(len(c.candidate_ids))
        self.candidates += len(candidates)
        created = time_text(when)
        for annotator, tiers, scores, notes in rankings:
            c.annotators.append(annotator)
            c.kinds.append(kind)
            c.ranking_groups.append(gid)
            for tier in tiers:
                c.tier_ids.extend(tier)
                c.tier_ids_offsets.append(len(c.tier_ids))
            c.tier_offsets.append(len(c.tier_ids_offsets) - 1)
            c.scores.append(json_text(scores))
            c.notes.append(json_text(notes))
            c.created.append(created)
            self.annotators[annotator] += 1
            self.partial += len({cid for tier in tiers for cid in tier}) < len(candidates)
        c.ranking_offsets.append(len(c.annotators))
        if len(c.group_ids) >= self.chunk:
            self.flush()
        return True

    def add_row(self, row: GroupRow) -> None:
        """Add a group made through the models (its ``to_row``), in its place."""
        if self._columns.group_ids:
            self.flush()
        self._rows.append(row)
        if len(self._rows) >= self.chunk:
            self.flush()

    def add_table(self, table: pa.Table, annotators: Counter[str], candidates: int,
                  models: set[str]) -> None:
        """Add groups already in their stored table (and their counts: rankings per annotator,
        candidates, models; none of the rankings partial), in their place."""
        self.flush()
        self.tables.append(table)
        self.annotators.update(annotators)
        self.candidates += candidates
        self.models |= models

    def flush(self) -> None:
        """The groups added since the last table as one more table."""
        if self._columns.group_ids:
            self.tables.append(self._columns.table())
            self._columns = _Columns()
        if self._rows:
            annotators, partial, candidates, models = row_stats(self._rows)
            self.annotators.update(annotators)
            self.partial += partial
            self.candidates += candidates
            self.models.update(models)
            self.tables.append(rows_table(self._rows, AnnotatedGroup))
            self._rows = []

    def table(self) -> pa.Table:
        """Every group added, in order, as one table (chunked as added)."""
        import pyarrow as pa

        self.flush()
        if not self.tables:
            return arrow_schema_for(AnnotatedGroup).empty_table()
        return pa.concat_tables(self.tables)
