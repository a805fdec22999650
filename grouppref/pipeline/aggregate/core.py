"""The aggregate stage's core: annotated groups in, validated groups out, no run store.

:func:`aggregate_groups` is the whole stage on records: ``Sequence[AnnotatedGroup]`` and an
:class:`~grouppref.pipeline.aggregate.config.AggregateConfig` in, an :class:`Aggregated`
(``ValidatedGroup`` records, rejects, the report) out. The ``aggregate`` stage
(:mod:`grouppref.pipeline.aggregate.stage`), the trainer's refresh rounds and the research code
call it, or its steps when they write shard by shard or read the fit itself:

1. :func:`collect_groups` (typed groups) or :func:`parse_rows` (raw rows, salvaged) ->
   :class:`ParsedInput`;
2. :func:`fit_parsed`: annotator reliability, the weighted per-group Bradley-Terry fit and
   the noise rules' decisions, for all groups at once -> :class:`Aggregation` (the fits of
   a large input, :data:`~.config.PARALLEL_GROUPS` groups or more, batch by batch in
   ``config.workers`` forked processes: the same result);
3. :func:`outcomes`: each group as a ``ValidatedGroup`` or a row ``Reject``;
4. :func:`report_of`: the :class:`~grouppref.schemas.reports.AggregateReport`.

The tensor-level pieces under them (:func:`encode_rankings`: rankings as ``(B, A, K)`` tier
indices; :func:`fit_groups`: the BT fit of such tensors -> :class:`BTFit`) are published here
too, for code that simulates rankings as tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from grouppref.errors import ConfigError
from grouppref.pipeline.aggregate.config import STAGE, AggregateConfig, workers_of
from grouppref.pipeline.aggregate.fit import BTFit, fit_groups, fit_in_batches, resolve_targets
from grouppref.pipeline.aggregate.outcome import (
    Decisions,
    build_report,
    decide,
    group_outcome,
    slot_weights,
)
from grouppref.pipeline.aggregate.parse import (
    ParsedInput,
    collect_groups,
    encode_design,
    encode_rankings,
    parse_rows,
)
from grouppref.runs.processes import process_map
from grouppref.schemas import AnnotatedGroup, Reject, ValidatedGroup
from grouppref.schemas.reports import AggregateReport
from grouppref.stats import bt
from grouppref.stats.reliability import Reliability, estimate_reliability, noise_rate

__all__ = ["Aggregated", "Aggregation", "BTFit", "ParsedInput", "aggregate_groups",
           "check_kind_weights", "collect_groups", "encode_rankings", "fit_groups",
           "fit_parsed", "outcomes", "parse_rows", "report_of"]


@dataclass
class Aggregation:
    """The fit of every parsed group: annotator reliability, the BT fit (numpy arrays over B
    groups) and what the noise rules decide for each group."""

    rel: Reliability
    fit: BTFit
    dec: Decisions
    targets: Literal["soft", "hard"]  # the pair targets written (resolve_targets)


@dataclass(frozen=True)
class Aggregated:
    """What :func:`aggregate_groups` makes of a list of groups: ``inputs == len(groups) +``
    the row rejects (``scope == "row"``) among ``rejects``; part-rejects name rankings left
    out of a kept group."""

    groups: list[ValidatedGroup]
    rejects: list[Reject]
    report: AggregateReport
    inputs: int


def check_kind_weights(config: AggregateConfig) -> None:
    """Raises ConfigError: every annotator kind has weight 0 (no ranking could count)."""
    if not any(w > 0 for w in config.kind_weights.values()):
        raise ConfigError("aggregate: every kind weight is 0; give at least one kind (e.g. "
                          "human=1) a positive weight")


def _kind_weights(parsed: ParsedInput, config: AggregateConfig) -> torch.Tensor:
    return torch.tensor([config.kind_weights.get(k, 0.0) for k in parsed.kinds],
                        dtype=bt.DTYPE)


def fit_parsed(parsed: ParsedInput, config: AggregateConfig) -> Aggregation:
    """Reliability -> weighted per-group BT fit -> noise-rule decisions, for all groups at
    once. Turn the result into records with :func:`outcomes`.

    Raises:
        ConvergenceError: a fit did not converge (raise ``max_iter`` or ``prior_strength``).
    """
    ranks, ann, valid = encode_rankings(parsed)
    design = encode_design(parsed) if config.reliability_groups == "auto" else None
    workers = workers_of(config, ranks.shape[0], -(-ranks.shape[0] // config.batch_size))
    # many tiny problems: threads only add contention (and the processes are forked after this)
    with bt.torch_threads(1), process_map(workers) as map_batches:
        rel = estimate_reliability(
            ranks, ann, _kind_weights(parsed, config), alpha=config.prior_strength,
            iterations=config.reliability_iterations, min_groups=config.min_groups_for_reliability,
            unreliable_tau=config.unreliable_tau, z=config.unreliable_z,
            drop=config.drop_unreliable, batch_size=config.batch_size, max_iter=config.max_iter,
            tie_tol=config.tie_tolerance, design=design, weight=config.reliability_weight,
            map_batches=map_batches)
        slot_w = slot_weights(ann, rel.annotator_weight)
        targets = resolve_targets(config, noise_rate(rel))
        fit = fit_in_batches(ranks, slot_w, valid, config, targets, map_batches)
    return Aggregation(rel=rel, fit=fit, dec=decide(ann, rel, fit, config), targets=targets)


def outcomes(parsed: ParsedInput, agg: Aggregation, config: AggregateConfig,
             indices: Sequence[int], stage: str = STAGE
             ) -> tuple[list[ValidatedGroup], list[Reject]]:
    """Groups ``indices`` of ``parsed`` as ValidatedGroups (flags set by the noise rules) and
    the row rejects of those a rule drops, each list in the order of ``indices``."""
    made = [group_outcome(parsed, b, agg.fit, agg.dec, config, stage) for b in indices]
    return ([o for o in made if isinstance(o, ValidatedGroup)],
            [o for o in made if isinstance(o, Reject)])


def report_of(parsed: ParsedInput, agg: Aggregation, config: AggregateConfig,
              source: str) -> AggregateReport:
    """The report (annotators, agreement, noise, rules, recommendation) of a fit; its
    ``counts`` are left for the caller that wrote the records."""
    return build_report(parsed, agg.rel, agg.fit, agg.dec, config, source, agg.targets)


def aggregate_groups(groups: Sequence[AnnotatedGroup], config: AggregateConfig, *,
                     source: str = "groups", stage: str = STAGE) -> Aggregated:
    """Aggregate the rankings of ``groups`` into ValidatedGroups, as the ``aggregate`` stage
    does (``source`` and ``stage`` go into the rejects; ``groups[i]`` is row ``i + 1``).

    Raises:
        ConfigError: the settings leave no annotator kind with a positive weight.
        ConvergenceError: a fit did not converge.
    """
    check_kind_weights(config)
    parsed = collect_groups(groups, source, stage)
    agg = fit_parsed(parsed, config)
    kept, dropped = outcomes(parsed, agg, config, range(len(parsed.groups)), stage)
    return Aggregated(groups=kept, rejects=parsed.rejects + dropped,
                      report=report_of(parsed, agg, config, source), inputs=parsed.inputs)
