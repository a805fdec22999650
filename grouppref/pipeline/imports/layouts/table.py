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

        schema = arrow_schema_for(AnnotatedGroup)
        prompt_type = schema.field("prompt").type
        message_type = prompt_type.field("messages").type
        messages = pa.ListArray.from_arrays(
            pa.array(self.message_offsets, pa.int32()),
            pa.StructArray.from_arrays([pa.array(self.roles, pa.string()),
                                        pa.array(self.contents, pa.string())],
                                       fields=list(message_type.value_type)),
            type=message_type, mask=pa.array(self.no_messages, pa.bool_()))
        prompt = pa.StructArray.from_arrays([
            pa.array(self.prompt_ids, pa.string()), messages, pa.array(self.texts, pa.string()),
            pa.array(self.references, pa.string()),
            pa.array(self.prompt_metadata, pa.string())], fields=list(prompt_type))
        return pa.Table.from_arrays([pa.array(self.group_ids, pa.string()), prompt,
                                     self._candidates(schema), self._rankings(schema)],
                                    schema=schema)

    def _candidates(self, schema: pa.Schema) -> pa.Array:
        import pyarrow as pa

        list_type = schema.field("candidates").type
        item = list_type.value_type
        source = item.field("source").type
        n = len(self.candidate_ids)
        sources = pa.StructArray.from_arrays([
            pa.repeat("import", n), pa.array(self.models, pa.string()),
            pa.repeat("{}", n), pa.nulls(n, source.field("seed").type)],
            fields=list(source))
        items = pa.StructArray.from_arrays([
            pa.array(self.candidate_ids, pa.string()), pa.array(self.candidate_texts, pa.string()),
            sources, pa.nulls(n, item.field("num_tokens").type),
            pa.nulls(n, item.field("behavior_logp").type)], fields=list(item))
        return pa.ListArray.from_arrays(pa.array(self.candidate_offsets, pa.int32()), items,
                                        type=list_type)

    def _rankings(self, schema: pa.Schema) -> pa.Array:
        import pyarrow as pa

        list_type = schema.field("rankings").type
        item = list_type.value_type
        annotator = item.field("annotator").type
        tiers_type = item.field("tiers").type
        n = len(self.annotators)
        annotators = pa.StructArray.from_arrays([
            pa.array(self.annotators, pa.string()), pa.array(self.kinds, pa.string()),
            pa.nulls(n, pa.string()), pa.nulls(n, pa.string())], fields=list(annotator))
        tiers = pa.ListArray.from_arrays(
            pa.array(self.tier_offsets, pa.int32()),
            pa.ListArray.from_arrays(pa.array(self.tier_ids_offsets, pa.int32()),
                                     pa.array(self.tier_ids, pa.string()),
                                     type=tiers_type.value_type), type=tiers_type)
        items = pa.StructArray.from_arrays([
            annotators, pa.array(self.ranking_groups, pa.string()), tiers,
            pa.array(self.scores, pa.string()), pa.array(self.notes, pa.string()),
            pa.array(self.created, pa.string())], fields=list(item))
        return pa.ListArray.from_arrays(pa.array(self.ranking_offsets, pa.int32()), items,
                                        type=list_type)


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
