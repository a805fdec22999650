"""The aggregate stage on its input stage's stored Arrow rows (issue 32): no record is built
for a group the rules keep and whose aggregate holds every check, and no row is converted to
Python.

A stage of the run writes its rows from records; when its ``data/`` is still byte for byte
what it wrote (:meth:`~grouppref.runs.store.RunStore.intact`) in its record type's schema,
aggregate does not validate every row again: :func:`stored_input` encodes the rankings from
the table's columns (:func:`~.encode.encode_columns`: the tensors
:func:`~.parse.encode_rankings` would make of the records), checking on the way what the
encoding relies on, and :func:`stored_outcomes` writes each shard as the table of the stored
rows :func:`~grouppref.schemas.arrow.to_row` would give for its ValidatedGroups: the
input's group columns taken as they are (texts, metadata as their JSON text), the aggregate's
columns built for the whole shard from the fit's arrays (:mod:`.columns`). The validate stage
after it checks every row in full, as it always does.

For a large input the shards are written by forked processes (:func:`written_shards`: each
makes a shard's table and files; the stage commits them in order), which share the
memory-mapped input and the fit.

Anything else goes through the records as before (validated, salvaged row by row): data
edited after it was written, a repeated group id (merged or rejected by
:func:`~.parse.collect_groups`), a row that breaks what the encoding relies on, a group a rule
drops (its reject reads the record), and an aggregate that fails a check (the record's
validation names it). ``tests/integration/test_data_equivalence.py``,
``tests/integration/test_aggregate_stored.py``, ``test_aggregate_columns.py`` and
``test_aggregate_encode.py`` hold the two paths equal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np
import pyarrow as pa
import torch

from grouppref.pipeline.aggregate.columns import AGGREGATE_FIELDS, aggregate_columns, layout
from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.encode import candidate_ids, encode_columns
from grouppref.pipeline.aggregate.fit import BTFit
from grouppref.pipeline.aggregate.outcome import (
    Decisions,
    group_flags,
    group_reject,
    validated_group,
)
from grouppref.pipeline.aggregate.parse import Encoded, ParsedInput
from grouppref.runs.processes import process_map
from grouppref.runs.stage_run import Shard, StageRun
from grouppref.schemas import AnnotatedGroup, CandidateGroup, Reject, ValidatedGroup
from grouppref.schemas.arrow import (
    arrow_schema_for,
    from_stored_row,
    rows_table,
    take_rows,
    to_row,
)

Row = dict[str, Any]  # a stored row: what grouppref.schemas.arrow.to_row gives
_GROUP_FIELDS = tuple(CandidateGroup.model_fields)


def annotated(group: CandidateGroup) -> AnnotatedGroup:
    """A stored group as the AnnotatedGroup it holds (a ValidatedGroup's aggregate left out,
    a CandidateGroup without rankings); its validated parts are reused as they are."""
    fields = {k: getattr(group, k) for k in _GROUP_FIELDS}
    return AnnotatedGroup.model_construct(**fields, rankings=getattr(group, "rankings", []))


class StoredGroups(Sequence[AnnotatedGroup]):
    """The rows of a stage's table read as AnnotatedGroups only when asked for (a reject's
    group id, a check that failed), each once; the table stays Arrow (memory-mapped from the
    stage's files), so no group is held as Python objects."""

    def __init__(self, table: pa.Table, record_type: type[CandidateGroup]) -> None:
        self.table, self.record_type = table, record_type
        self._made: dict[int, AnnotatedGroup] = {}

    def __len__(self) -> int:
        return self.table.num_rows

    @overload
    def __getitem__(self, i: int) -> AnnotatedGroup: ...
    @overload
    def __getitem__(self, i: slice) -> list[AnnotatedGroup]: ...

    def __getitem__(self, i: int | slice) -> AnnotatedGroup | list[AnnotatedGroup]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        if i not in self._made:
            row = self.table.slice(i, 1).to_pylist()[0]
            self._made[i] = annotated(from_stored_row(self.record_type, row))
        return self._made[i]


def stored_input(table: pa.Table, record_type: type[CandidateGroup], source: str
                 ) -> ParsedInput | None:
    """The rows of ``table`` (stored groups in ``record_type``'s schema, as a stage of the run
    wrote them) as :func:`collect_groups` would collect their records, rankings encoded
    column-wise (:func:`~.encode.encode_columns`); ``None`` when a group id repeats (the
    records path merges or rejects repeats) or a row breaks what the encoding relies on, so
    that the records path validates and salvages the input."""
    import pyarrow.compute as pc

    b = table.num_rows
    if pc.count_distinct(table.column("group_id")).as_py() != b:
        return None
    parsed = ParsedInput(source=source, inputs=b, groups=StoredGroups(table, record_type),
                         rows=list(range(1, b + 1)))

    def longest(column: str, default: int) -> int:
        if column not in table.column_names or b == 0:
            return default
        return int(pc.max(pc.list_value_length(table.column(column))).as_py() or 0)

    k, a = longest("candidates", 2), longest("rankings", 1) or 1
    if "candidates" not in table.column_names:
        return None
    rankings = table.column("rankings") if "rankings" in table.column_names else None
    made = encode_columns(table.column("group_id").combine_chunks(),
                          candidate_ids(table.column("candidates")),
                          None if rankings is None else rankings.combine_chunks(), k, a)
    if made is None:
        return None
    parsed.annotators, parsed.kinds = made.annotators, made.kinds
    parsed.index = {aid: i for i, aid in enumerate(made.annotators)}
    parsed.encoded = Encoded(ranks=torch.from_numpy(made.ranks), ann=torch.from_numpy(made.ann),
                             valid=torch.from_numpy(made.valid),
                             design=torch.from_numpy(made.design), marked=made.marked)
    return parsed


def _rankings(groups: pa.Table) -> pa.Array | None:
    """The ``(n,)`` rankings column of ``groups`` in one chunk, a missing list as an empty
    one (as the records read it); ``None`` when the table has no such column."""
    if "rankings" not in groups.column_names:
        return None
    column = groups.column("rankings").combine_chunks()
    if column.null_count:
        column = pa.array([r or [] for r in column.to_pylist()], column.type)
    return column


def with_records(out: pa.Table, bad: np.ndarray, row_of: Callable[[int], Row]) -> pa.Table:
    """``out`` (``(n,)`` rows) with the rows where ``bad`` ``(n,)`` replaced by
    ``row_of(position)``, in place."""
    where = np.nonzero(bad)[0]
    good = np.nonzero(~bad)[0]
    fixed = rows_table([row_of(int(i)) for i in where], ValidatedGroup)
    merged = pa.concat_tables([out.take(pa.array(good)), fixed.cast(out.schema)])
    return merged.take(pa.array(np.argsort(np.concatenate([good, where]))))


def stored_outcomes(parsed: ParsedInput, table: pa.Table, fit: BTFit, dec: Decisions,
                    config: AggregateConfig, indices: Sequence[int], stage: str
                    ) -> tuple[pa.Table, list[Reject]]:
    """Groups ``indices`` (rows of ``table``) as the table of the stored rows of their
    ValidatedGroups (what ``to_row`` gives, one chunk per column) and the row rejects of
    those a rule drops, each in the order of ``indices``: the input's group columns taken as
    they are, the aggregate's built column-wise (:mod:`.columns`); a group whose aggregate
    fails a check is made as a record (its validation names what failed)."""
    order = np.asarray(indices, dtype=np.int64)
    rejected = dec.rejected[order]
    rejects = [group_reject(parsed, b, fit, dec, config, stage)
               for b in order[rejected].tolist()]
    kept = order[~rejected]
    groups = take_rows(table, kept.tolist())
    lay = layout(kept, candidate_ids(groups.column("candidates")))
    rankings = _rankings(groups)
    made, holds = aggregate_columns(lay, fit, dec, config, rankings)
    schema = arrow_schema_for(ValidatedGroup)
    if rankings is None:
        kind = schema.field("rankings").type
        rankings = pa.ListArray.from_arrays(pa.array(np.zeros(len(kept) + 1, np.int32)),
                                            pa.array([], kind.value_type), type=kind)
    out = pa.Table.from_arrays([*(groups.column(f) for f in _GROUP_FIELDS), rankings,
                                *(made[f] for f in AGGREGATE_FIELDS)], schema=schema)
    if not holds.all():  # the record's own validation decides, and names what failed
        def row_of(i: int) -> Row:
            b = int(kept[i])
            return to_row(validated_group(parsed, b, fit, dec.used, group_flags(b, dec, config)))
        out = with_records(out, ~holds, row_of)
    return out.combine_chunks(), rejects


@dataclass(frozen=True)
class StoredWrite:
    """What writes a shard of the aggregate stage from its input's stored rows
    (:func:`stored_outcomes`): the stage, the input and its fit."""

    stage: StageRun[ValidatedGroup]
    parsed: ParsedInput
    table: pa.Table
    fit: BTFit
    dec: Decisions
    config: AggregateConfig

    def files(self, shard: Shard[int]) -> Path:
        """The shard's rejects and rows written (:meth:`StageRun.shard_files`), not yet
        committed; the temporary file of its rows."""
        kept, dropped = stored_outcomes(self.parsed, self.table, self.fit, self.dec, self.config,
                                        shard.items, self.stage.name)
        return self.stage.shard_files(shard, kept, dropped)


_SHARED: StoredWrite | None = None  # what the forked processes write from


def _shared_files(shard: Shard[int]) -> Path:
    assert _SHARED is not None
    return _SHARED.files(shard)


@contextmanager
def written_shards(write: StoredWrite, shards: Sequence[Shard[int]], workers: int
                   ) -> Iterator[Iterator[Shard[int]]]:
    """``shards``, each committed as the caller takes it, in order; their files made in this
    process, or by ``workers`` forked processes (2 or more: started on entering, before the
    caller shows progress; they share the memory-mapped input and the fit)."""
    global _SHARED
    _SHARED = write
    try:
        with process_map(workers) as map_shards:
            made = zip(shards, map_shards(_shared_files, shards), strict=True)
            yield (_committed(write.stage, shard, tmp) for shard, tmp in made)
    finally:
        _SHARED = None


def _committed(stage: StageRun[ValidatedGroup], shard: Shard[int], tmp: Path) -> Shard[int]:
    stage.commit_shard(shard, tmp)
    return shard
