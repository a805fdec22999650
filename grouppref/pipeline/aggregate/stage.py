"""The ``aggregate`` stage: annotated groups -> ValidatedGroup (consensus, strengths, pairs).

Per group a Bradley-Terry MAP fit (L2 prior, see :mod:`grouppref.stats.bt`) on the weighted
pairwise votes of its rankings (ties count half a win each way); all groups of a batch are
fitted together. Annotator weights come from reliability across the whole dataset
(:mod:`grouppref.stats.reliability`; an annotator who ranked groups chosen by uncertainty is
judged on its uniformly drawn audit groups only, ``reliability_groups``); noise rules flag or
drop groups; the report (``RUN/aggregate/report.json``) gives reliability, agreement, the
estimated noise rate and a loss *recommendation* (DPO fallback above ``dpo_fallback_threshold``
with soft targets), never an automatic switch. The pair targets written to the rows are the BT
``p_ij``/``w_ij`` (soft) or the consensus order's hard targets; ``pair_targets="auto"`` (the
default) picks hard ones above ``hard_targets_above`` estimated noise (docs/evidence.md, issue
16).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError

from grouppref.errors import StageError
from grouppref.pipeline.aggregate.config import (
    INPUT_STAGES,
    STAGE,
    STAGE_VERSION,
    AggregateConfig,
    workers_of,
)
from grouppref.pipeline.aggregate.core import (
    Aggregation,
    ParsedInput,
    check_kind_weights,
    collect_groups,
    fit_parsed,
    outcomes,
    parse_rows,
    report_of,
)
from grouppref.pipeline.aggregate.stored import (
    StoredWrite,
    annotated,
    stored_input,
    written_shards,
)
from grouppref.readers.published import annotated_rows, open_published
from grouppref.runs.collector import cycle_collection_paused
from grouppref.runs.progress import stage_progress
from grouppref.runs.stage import StageContext
from grouppref.runs.stage_run import Shard
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import AnnotatedGroup, CandidateGroup, Reject, ValidatedGroup
from grouppref.schemas.arrow import (
    from_table,
    stored_as,
    table_rows,
)
from grouppref.schemas.reports import AggregateReport

if TYPE_CHECKING:
    import pyarrow as pa

REPORT = "report.json"


def resolve_input(store: RunStore, config: AggregateConfig) -> str:
    """The input stage: ``config.input_stage`` or the first complete of label, simulate, rank,
    import.

    Raises:
        StageError: the stage is missing / incomplete, or none of the defaults completed.
    """
    if config.input_stage is not None:
        store.require(config.input_stage)
        return config.input_stage
    for name in INPUT_STAGES:
        if store.is_complete(name):
            return name
    raise StageError(f"{store.root}: none of {list(INPUT_STAGES)} has completed; run "
                     "`grouppref rank`, `grouppref simulate`, `grouppref label pull` or "
                     "`grouppref import` first")


@dataclass
class _Read:
    """The input collected; ``table``: its stored table when aggregate writes from its rows
    (:mod:`grouppref.pipeline.aggregate.stored`), else ``None`` (records)."""

    parsed: ParsedInput
    table: pa.Table | None = None


@dataclass
class _Input:
    """What aggregate reads (``read``: collect it, rejects made reading it included; called
    only when the stage is not cached), where from, the cache key's input half (external
    fingerprint, stages of the run read) and the settings as recorded."""

    read: Callable[[], _Read]
    rejects: list[Reject]  # rows of a published dataset that hold no group at all
    source: str
    fingerprint: str
    reads: list[str]
    config: AggregateConfig


# the record types of a run's stages that hold groups, read as such
_GROUP_TYPES: dict[str, type[CandidateGroup]] = {
    "CandidateGroup": CandidateGroup, "AnnotatedGroup": AnnotatedGroup,
    "ValidatedGroup": ValidatedGroup}


def _stage_groups(store: RunStore, source: str) -> _Read:
    """The groups of stage ``source`` of the run. Rows its stage wrote and nobody edited since
    (:meth:`RunStore.intact`, the record type's schema) are aggregated as stored rows
    (:func:`stored_input`); other rows are read as the records they hold
    (:func:`collect_groups`), and rows that do not read as their record type (another record
    type, a dataset edited by hand) go through the salvaging reader (:func:`parse_rows`),
    which rejects what is invalid row by row and ranking by ranking."""
    record_type = _GROUP_TYPES.get(store.require(source).record_type or "")
    table = store.load_table(source)
    if record_type is not None:
        if stored_as(table.schema, record_type) and store.intact(source):
            if (parsed := stored_input(table, record_type, source)) is not None:
                return _Read(parsed, table)
        try:
            records = from_table(table, record_type)
        except (ValidationError, ValueError, TypeError):
            pass  # a row that is not a valid record: salvage it below
        else:
            return _Read(collect_groups([annotated(g) for g in records], source, STAGE))
    return _Read(parse_rows(list(table_rows(table)), source, STAGE))


def _input(store: RunStore, config: AggregateConfig) -> _Input:
    if config.source:  # a published dataset, read instead of a stage of the run
        published = open_published(config.source, STAGE)
        rows = annotated_rows(published)
        return _Input(lambda: _Read(parse_rows(rows, published.source, STAGE)), published.rejects,
                      published.source, published.fingerprint, [], config)
    source = resolve_input(store, config)
    return _Input(lambda: _stage_groups(store, source), [], source, "", [source],
                  config.model_copy(update={"input_stage": source}))


def run_aggregate(store: RunStore, config: AggregateConfig,
                  context: StageContext = StageContext()) -> StageRun[ValidatedGroup]:
    """Aggregate the rankings of every group of the input stage into ValidatedGroups.

    Bad rankings become part-rejects (the rest of the group is kept); unusable rows and rows
    dropped by a noise rule become row rejects; ``inputs == outputs + rejected``. With
    ``config.source`` the groups and rankings of a published dataset are read instead of a
    stage of the run (:mod:`grouppref.readers.published`).

    Raises:
        StageError: no input stage has completed (and no source is given).
        InputFileError: ``source`` cannot be read, or holds no rankings (TRL pairs).
        ConfigError: the settings leave no annotator kind with a positive weight.
        ConvergenceError: a fit did not converge (raise ``max_iter`` or ``prior_strength``).
    """
    check_kind_weights(config)
    got = _input(store, config)
    stage = store.open_stage(STAGE, got.config, input_fingerprint=got.fingerprint,
                             inputs=got.reads, record_type=ValidatedGroup,
                             stage_version=STAGE_VERSION, force=context.force)
    if stage.cached:
        return stage
    with cycle_collection_paused():  # every group's arrays and rows stay alive meanwhile
        return _aggregate(store, stage, got, config)


def _aggregate(store: RunStore, stage: StageRun[ValidatedGroup], got: _Input,
               config: AggregateConfig) -> StageRun[ValidatedGroup]:
    """Read, fit and write the groups of ``got`` into ``stage``, then its report."""
    read = got.read()
    parsed = read.parsed
    stage.add_rejects("input", got.rejects + parsed.rejects)
    agg = fit_parsed(parsed, config)
    indices = list(range(len(parsed.groups)))
    shards = list(stage.pending_shards(indices, shard_size=config.shard_size))
    with _written(stage, read, agg, config, shards) as written, stage_progress() as bar:
        task = bar.add_task(STAGE, total=len(indices), unit="groups",
                            completed=stage.done_items(indices, config.shard_size))
        for shard in written:
            bar.advance(task, len(shard.items))
    report = report_of(parsed, agg, config, got.source)
    done = stage.finish(inputs=parsed.inputs + len(got.rejects),
                        stats=report.summary.model_dump(mode="json"))
    report.counts = done.counts.model_dump()
    (done.dir / REPORT).write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return done


@contextmanager
def _written(stage: StageRun[ValidatedGroup], read: _Read, agg: Aggregation,
             config: AggregateConfig, shards: list[Shard[int]]) -> Iterator[Iterator[Shard[int]]]:
    """The pending ``shards``, each written as the caller takes it: from the stored rows
    (:func:`written_shards`, in ``config.workers`` processes for a large input) or from the
    records."""
    if read.table is None:
        def from_records(shard: Shard[int]) -> Shard[int]:
            stage.write_shard(shard, *outcomes(read.parsed, agg, config, shard.items))
            return shard
        yield map(from_records, shards)
        return
    workers = workers_of(config, len(read.parsed.groups), len(shards))
    stored = StoredWrite(stage, read.parsed, read.table, agg.fit, agg.dec, config)
    with written_shards(stored, shards, workers) as written:
        yield written


def read_report(store: RunStore) -> AggregateReport:
    """The report of a finished aggregate stage (``RUN/aggregate/report.json``)."""
    store.require(STAGE)
    path = store.stage_dir(STAGE) / REPORT
    if not path.exists():
        raise StageError(f"{path} is missing; re-run `grouppref aggregate --force`")
    return AggregateReport.model_validate_json(path.read_text(encoding="utf-8"))
