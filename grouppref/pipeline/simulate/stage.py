"""Simulated annotator panels, and the ``simulate`` stage that adds their rankings to a run.

An annotator with flip rate ``f`` ranks each group by a Mallows model centred on the true
order: its dispersion ``phi`` is solved so that the *expected share of pairwise votes against
the truth* is exactly ``f`` (Kendall distance / number of pairs). ``random`` annotators rank
uniformly at random (f = 0.5), ``reversed`` ones return the true order backwards (f = 1).
Mallows keeps each ranking a consistent order, so flips cluster on close pairs (adjacent in
the true order), as with real annotators.

Truth: per group, true scores come from the rankings already there (by default the mean
normalised position, or normalised score, over the automatic rankings: reward models, rules,
LLM judges). Candidates with equal true scores are ordered at random and their pairs are left
out of the realised flip rates recorded in the manifest.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from grouppref.errors import ConfigError, StageError
from grouppref.pipeline.simulate.config import (
    STAGE,
    STAGE_VERSION,
    AnnotatorSpec,
    SimulateConfig,
)
from grouppref.runs.progress import stage_progress
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import AnnotatedGroup, Annotator, Ranking, Reject, from_row


# -- Mallows ---------------------------------------------------------------------------------
def mallows_flip_rate(phi: float, k: int) -> float:
    """Expected share of discordant pairs of a Mallows(phi) ranking of ``k`` items.

    Repeated insertion: item ``i`` (1-based) adds ``j`` inversions with probability
    ``phi^j / sum_{l<i} phi^l``, so ``E[d] = sum_i sum_j j phi^j / sum_j phi^j``.
    """
    if k < 2:
        return 0.0
    total = 0.0
    for i in range(2, k + 1):
        weights = [phi**j for j in range(i)]
        total += sum(j * w for j, w in enumerate(weights)) / sum(weights)
    return total / (k * (k - 1) / 2)


@cache
def mallows_phi(flip_rate: float, k: int) -> float:
    """The dispersion ``phi`` in [0, 1] whose Mallows model has the given flip rate (bisection).

    Raises:
        ValueError: ``flip_rate`` outside [0, 0.5].
    """
    if not 0.0 <= flip_rate <= 0.5:
        raise ValueError(f"flip_rate must be in [0, 0.5], got {flip_rate}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mallows_flip_rate(mid, k) < flip_rate else (lo, mid)
    return (lo + hi) / 2


def sample_mallows(true_order: Sequence[int], phi: float, rng: np.random.Generator) -> list[int]:
    """One Mallows(phi) ranking around ``true_order`` (best first) by repeated insertion."""
    out: list[int] = []
    for i, item in enumerate(true_order):
        # inserting at position pos (pos = i: no inversion) adds i - pos inversions
        cum = np.cumsum(phi ** np.arange(i, -1, -1, dtype=float))
        pos = int(np.searchsorted(cum, rng.random() * cum[-1], side="right")) if phi > 0 else i
        out.insert(min(pos, i), item)
    return out


def simulate_order(scores: Sequence[float], spec: AnnotatorSpec,
                   rng: np.random.Generator) -> list[int]:
    """A simulated annotator's strict order (candidate indices, best first) of true ``scores``.

    Equal true scores are ordered at random.
    """
    k = len(scores)
    tiebreak = rng.permutation(k)
    truth = sorted(range(k), key=lambda i: (-scores[i], tiebreak[i]))
    if spec.behavior == "random":
        return [int(i) for i in rng.permutation(k)]
    if spec.behavior == "reversed":
        return truth[::-1]
    return sample_mallows(truth, mallows_phi(spec.flip_rate, k), rng)


def order_flips(order: Sequence[int], scores: Sequence[float]) -> tuple[int, int]:
    """(pairs against the truth, pairs with distinct true scores) of a strict ``order``."""
    pos = {c: r for r, c in enumerate(order)}
    flips = pairs = 0
    for i in range(len(scores)):
        for j in range(i + 1, len(scores)):
            if scores[i] == scores[j]:
                continue
            pairs += 1
            flips += (scores[i] > scores[j]) != (pos[i] < pos[j])
    return flips, pairs


# -- truth -------------------------------------------------------------------------------------
def ranking_scores(ranking: Ranking, ids: list[str], use_scores: bool) -> list[float]:
    """Per-candidate scores in [0, 1] (1 = best) of one ranking: min-max normalised
    ``scores`` when given for every candidate, else ``1 - (midrank - 1) / (K - 1)``."""
    if use_scores and ranking.scores and set(ranking.scores) >= set(ids):
        raw = [ranking.scores[c] for c in ids]
        lo, hi = min(raw), max(raw)
        return [0.5 if hi == lo else (x - lo) / (hi - lo) for x in raw]
    mid: dict[str, float] = {}
    above = 0
    for tier in ranking.tiers:
        for cid in tier:
            mid[cid] = above + (len(tier) + 1) / 2
        above += len(tier)
    k = len(ids)
    return [1 - (mid[c] - 1) / (k - 1) for c in ids]


def true_scores(group: AnnotatedGroup, config: SimulateConfig) -> list[float]:
    """The group's true scores per candidate (in candidate order).

    Raises:
        ValueError: no ranking of the group can supply the truth.
    """
    ids = group.candidate_ids()
    if config.truth_annotator is not None:
        source = [r for r in group.rankings if r.annotator.id == config.truth_annotator]
        what = f"annotator {config.truth_annotator!r}"
    else:
        source = [r for r in group.rankings if r.annotator.kind in config.truth_kinds]
        what = f"rankings of kind {config.truth_kinds}"
    # a partial ranking (it leaves candidates out) says nothing of the ones it leaves out
    complete = [r for r in source if sum(len(t) for t in r.tiers) == len(ids)]
    if source and not complete:
        raise ValueError(f"the {what} of this group are partial (they leave candidates out); "
                         "the truth needs a ranking of every candidate: rank the group first")
    source = complete
    if not source:
        raise ValueError(f"no {what} to take the true scores from; rank the group first or set "
                         "truth_kinds / truth_annotator")
    per = np.array([ranking_scores(r, ids, config.truth_use_scores) for r in source])
    return [float(x) for x in per.mean(0)]


def simulate_rankings(group: AnnotatedGroup, scores: Sequence[float],
                      panel: Sequence[AnnotatorSpec], rng: np.random.Generator
                      ) -> tuple[list[Ranking], dict[str, tuple[int, int]]]:
    """Rankings of ``group`` by each member of ``panel`` (kind ``simulated``), and each
    member's (flips, pairs) against ``scores``."""
    ids = group.candidate_ids()
    rankings, flips = [], {}
    for spec in panel:
        order = simulate_order(scores, spec, rng)
        flips[spec.id] = order_flips(order, scores)
        rankings.append(Ranking(
            annotator=Annotator(id=spec.id, kind="simulated", name=spec.behavior,
                                version=f"flip_rate={spec.expected_flip_rate():g}"),
            group_id=group.group_id, tiers=[[ids[i]] for i in order]))
    return rankings, flips


# -- stage -------------------------------------------------------------------------------------
def _check_panel(config: SimulateConfig) -> None:
    ids = [a.id for a in config.annotators]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"simulate: annotator ids must be unique, got {ids}")
    if config.per_group is not None and config.per_group > len(ids):
        raise ConfigError(f"simulate: per_group={config.per_group} but the panel has only "
                          f"{len(ids)} annotators; lower per_group or add annotators")


def _simulate_one(group: AnnotatedGroup, config: SimulateConfig, rng: np.random.Generator,
                  tally: dict[str, list[int]]) -> AnnotatedGroup:
    scores = true_scores(group, config)
    panel = list(config.annotators)
    if config.per_group is not None:
        panel = [panel[i] for i in sorted(rng.choice(len(panel), config.per_group, replace=False))]
    taken = {r.annotator.id for r in group.rankings} & {a.id for a in panel}
    if taken:
        raise ValueError(f"the group already has rankings by {sorted(taken)}; simulated ids "
                         "must differ from existing annotators")
    rankings, flips = simulate_rankings(group, scores, panel, rng)
    out = AnnotatedGroup(**{**group.model_dump(), "rankings": [*group.rankings, *rankings]})
    for aid, (f, n) in flips.items():
        tally.setdefault(aid, [0, 0])
        tally[aid][0] += f
        tally[aid][1] += n
    return out


def run_simulate(store: RunStore, config: SimulateConfig,
                 context: StageContext = StageContext()) -> StageRun[AnnotatedGroup]:
    """Add a simulated panel's rankings to the groups of ``config.input_stage``.

    Rows that fail validation, or have no ranking to take the truth from, are rejected with
    the reason. The manifest stats record each annotator's configured and realised flip rate.

    Raises:
        ConfigError: duplicate annotator ids or ``per_group`` larger than the panel.
        StageError: the input stage has not completed.
    """
    _check_panel(config)
    manifest = store.require(config.input_stage)
    if manifest.record_type not in ("AnnotatedGroup", "ValidatedGroup"):
        raise StageError(f"simulate: stage {config.input_stage!r} holds "
                         f"{manifest.record_type} rows, not AnnotatedGroup")
    rows = list(store.load_dataset(config.input_stage))
    stage = store.open_stage(STAGE, config, inputs=[config.input_stage],
                             record_type=AnnotatedGroup, stage_version=STAGE_VERSION, force=context.force)
    if stage.cached:
        return stage
    with stage_progress() as bar:
        task = bar.add_task(STAGE, total=len(rows), unit="groups",
                            completed=stage.done_items(rows, config.shard_size))
        for shard in stage.pending_shards(rows, shard_size=config.shard_size):
            rng = np.random.default_rng([config.seed, shard.index])  # same draws on resume
            tally: dict[str, list[int]] = {}
            records, rejects = [], []
            for offset, row in enumerate(shard.items):
                number = shard.start + offset + 1
                try:
                    group = from_row(AnnotatedGroup, _annotated_row(row))
                    records.append(_simulate_one(group, config, rng, tally))
                except (ValidationError, ValueError) as e:
                    rejects.append(Reject(stage=STAGE, reason=_reason(e), source=config.input_stage,
                                          row=number, group_id=row.get("group_id")))
            # the flip tally is kept beside the shard so that a resumed run still counts it
            _tally_path(stage.dir, shard.index).parent.mkdir(parents=True, exist_ok=True)
            _tally_path(stage.dir, shard.index).write_text(json.dumps(tally), encoding="utf-8")
            stage.write_shard(shard, records, rejects)
            bar.advance(task, len(shard.items))
    total: dict[str, list[int]] = {}
    for path in sorted((stage.dir / "shards").glob("tally-*.json")):
        for aid, (f, n) in json.loads(path.read_text(encoding="utf-8")).items():
            total.setdefault(aid, [0, 0])
            total[aid][0] += f
            total[aid][1] += n
    stats = {"annotators": {
        a.id: {"behavior": a.behavior, "flip_rate": a.expected_flip_rate(),
               "realised_flip_rate": total[a.id][0] / total[a.id][1]
               if total.get(a.id, [0, 0])[1] else None,
               "pairs": total.get(a.id, [0, 0])[1]}
        for a in config.annotators}}
    return stage.finish(inputs=len(rows), stats=stats)


def _tally_path(stage_dir: Path, index: int) -> Path:
    return stage_dir / "shards" / f"tally-{index:05d}.json"


def _annotated_row(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row reduced to the AnnotatedGroup fields (a ValidatedGroup input has more)."""
    keep = AnnotatedGroup.model_fields
    return {k: v for k, v in row.items() if k in keep}


def _reason(e: Exception) -> str:
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        return f"{first['msg']} (in {loc})" if loc else first["msg"]
    return str(e)


