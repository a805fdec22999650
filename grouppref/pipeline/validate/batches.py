"""A stored table checked record batch by record batch (:mod:`.batch`: which rows are sound,
and their facts), in this process or, for a large table, in several at once.

The check of one batch depends on nothing but the batch and the repeated group ids (known
before), so the batches are checked in forked processes (:mod:`grouppref.runs.processes`:
they share the memory-mapped table) and their results taken in batch order: the stage adds
them to its :class:`~.core.Checks` as it would add its own, and its result is the same
(``tests/unit/pipeline/validate/test_batch.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from grouppref.pipeline.validate.batch import check_sound, row_facts
from grouppref.pipeline.validate.core import GroupFacts
from grouppref.runs.processes import forked_pool, workers_for

BATCH_ROWS = 4096  # rows checked on Arrow at once
PARALLEL_ROWS = 20_000  # the fewest rows worth checking in other processes


@dataclass(frozen=True)
class Checked:
    """A batch's check: ``sound[i]``, row ``i`` is proved a valid group whose id does not
    repeat; ``facts``, those rows' facts, in row order."""

    sound: np.ndarray
    facts: list[GroupFacts]


def check_batch(batch: pa.RecordBatch, repeated: pa.Array, split_by: str) -> Checked:
    """:class:`Checked` of one batch; ``repeated``: the group ids of more than one row."""
    import pyarrow.compute as pc

    sound = check_sound(batch)
    if len(repeated):
        sound &= ~np.asarray(pc.is_in(batch.column("group_id"), value_set=repeated)
                             .fill_null(False).to_numpy(zero_copy_only=False), bool)
    return Checked(sound, row_facts(batch, np.flatnonzero(sound).tolist(), split_by))


# what the forked processes check: the batches, the repeated ids, the split key
_SHARED: tuple[list[pa.RecordBatch], pa.Array, str] | None = None


def _check_shared(index: int) -> Checked:
    assert _SHARED is not None
    batches, repeated, split_by = _SHARED
    return check_batch(batches[index], repeated, split_by)


@contextmanager
def checked_batches(table: pa.Table, repeated: set[str], split_by: str, workers: int = 0
                    ) -> Iterator[Iterator[tuple[pa.RecordBatch, Checked]]]:
    """The batches of ``table`` (:data:`BATCH_ROWS` rows) with their checks, in order; from
    ``workers`` processes (0: one per core) when the table has :data:`PARALLEL_ROWS` rows or
    more, started on entering (before the caller shows progress)."""
    global _SHARED
    batches = table.to_batches(max_chunksize=BATCH_ROWS)
    ids = pa.array(sorted(repeated), pa.string())
    n = workers_for(workers, len(batches)) if table.num_rows >= PARALLEL_ROWS else 1
    if n < 2:
        yield ((b, check_batch(b, ids, split_by)) for b in batches)
        return
    _SHARED = (batches, ids, split_by)
    try:
        with forked_pool(n) as pool:
            yield zip(batches, pool.map(_check_shared, range(len(batches))), strict=True)
    finally:
        _SHARED = None
