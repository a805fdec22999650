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

from dataclasses import dataclass
from typing import Any, Literal

import torch

from grouppref.errors import ConfigError, StageError
from grouppref.pipeline.aggregate.config import INPUT_STAGES, STAGE, STAGE_VERSION, AggregateConfig
from grouppref.pipeline.aggregate.fit import BTFit, fit_groups, resolve_targets, with_targets
from grouppref.pipeline.aggregate.outcome import (
    Decisions,
    build_report,
    decide,
    group_outcome,
    slot_weights,
)
from grouppref.pipeline.aggregate.parse import (
    ParsedInput,
    encode_design,
    encode_rankings,
    parse_rows,
)
from grouppref.readers.published import annotated_rows, open_published
from grouppref.runs.progress import stage_progress
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.schemas.arrow import dataset_rows
from grouppref.schemas.reports import AggregateReport
from grouppref.stats import bt
from grouppref.stats.reliability import Reliability, estimate_reliability, noise_rate

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
class _Input:
    """What aggregate reads: rows, rejects made reading them, where from, the cache key's input
    half (external fingerprint, stages of the run read) and the settings as recorded."""

    rows: list[dict[str, Any]]
    rejects: list[Reject]
    source: str
    fingerprint: str
    reads: list[str]
    config: AggregateConfig


def _input(store: RunStore, config: AggregateConfig) -> _Input:
    if config.source:  # a published dataset, read instead of a stage of the run
        published = open_published(config.source, STAGE)
        return _Input(annotated_rows(published), published.rejects, published.source,
                      published.fingerprint, [], config)
    source = resolve_input(store, config)
    store.require(source)
    return _Input(list(dataset_rows(store.load_dataset(source))), [], source, "", [source],
                  config.model_copy(update={"input_stage": source}))


def _kind_weights(parsed: ParsedInput, config: AggregateConfig) -> torch.Tensor:
    return torch.tensor([config.kind_weights.get(k, 0.0) for k in parsed.kinds],
                        dtype=bt.DTYPE)


@dataclass
class Aggregation:
    """The fit of every parsed group: annotator reliability, the BT fit (numpy) and what
    the noise rules decide for each group."""

    rel: Reliability
    fit: BTFit
    dec: Decisions
    targets: Literal["soft", "hard"]  # the pair targets written (resolve_targets)


def fit_parsed(parsed: ParsedInput, config: AggregateConfig) -> Aggregation:
    """Reliability -> weighted per-group BT fit -> noise-rule decisions, for all groups at once
    (the aggregate stage's numerics; the trainer's refresh rounds use them too). Turn the
    result into rows with :func:`~grouppref.pipeline.aggregate.outcome.group_outcome`."""
    ranks, ann, valid = encode_rankings(parsed)
    design = encode_design(parsed) if config.reliability_groups == "auto" else None
    with bt.torch_threads(1):  # many tiny problems: threads only add contention
        rel = estimate_reliability(
            ranks, ann, _kind_weights(parsed, config), alpha=config.prior_strength,
            iterations=config.reliability_iterations, min_groups=config.min_groups_for_reliability,
            unreliable_tau=config.unreliable_tau, z=config.unreliable_z,
            drop=config.drop_unreliable, batch_size=config.batch_size, max_iter=config.max_iter,
            tie_tol=config.tie_tolerance, design=design, weight=config.reliability_weight)
        slot_w = slot_weights(ann, rel.annotator_weight)
        targets = resolve_targets(config, noise_rate(rel))
        fit = with_targets(fit_groups(ranks, slot_w, valid, config), targets)
    fit_np = fit.numpy()
    return Aggregation(rel=rel, fit=fit_np, dec=decide(ann, rel, fit_np, config), targets=targets)


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
    if not any(w > 0 for w in config.kind_weights.values()):
        raise ConfigError("aggregate: every kind weight is 0; give at least one kind (e.g. "
                          "human=1) a positive weight")
    got = _input(store, config)
    stage = store.open_stage(STAGE, got.config, input_fingerprint=got.fingerprint,
                             inputs=got.reads, record_type=ValidatedGroup,
                             stage_version=STAGE_VERSION, force=context.force)
    if stage.cached:
        return stage
    parsed = parse_rows(got.rows, got.source, STAGE)
    stage.add_rejects("input", got.rejects + parsed.rejects)
    agg = fit_parsed(parsed, config)
    rel, fit_np, dec, targets = agg.rel, agg.fit, agg.dec, agg.targets
    indices = list(range(len(parsed.groups)))
    with stage_progress() as bar:
        task = bar.add_task(STAGE, total=len(indices), unit="groups",
                            completed=stage.done_items(indices, config.shard_size))
        for shard in stage.pending_shards(indices, shard_size=config.shard_size):
            outcomes = [group_outcome(parsed, b, fit_np, dec, config, STAGE) for b in shard.items]
            stage.write_shard(shard, [o for o in outcomes if isinstance(o, ValidatedGroup)],
                              [o for o in outcomes if isinstance(o, Reject)])
            bar.advance(task, len(shard.items))
    report = build_report(parsed, rel, fit_np, dec, config, got.source, targets)
    done = stage.finish(inputs=parsed.inputs + len(got.rejects),
                        stats=report.summary.model_dump(mode="json"))
    report.counts = done.counts.model_dump()
    (done.dir / REPORT).write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return done


def read_report(store: RunStore) -> AggregateReport:
    """The report of a finished aggregate stage (``RUN/aggregate/report.json``)."""
    store.require(STAGE)
    path = store.stage_dir(STAGE) / REPORT
    if not path.exists():
        raise StageError(f"{path} is missing; re-run `grouppref aggregate --force`")
    return AggregateReport.model_validate_json(path.read_text(encoding="utf-8"))
