"""The ``simulate`` stage: a simulated annotator panel's rankings added to the groups of a run
(the panel itself: :mod:`grouppref.pipeline.simulate.core`). The manifest records each
annotator's configured and realised flip rate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from grouppref.errors import StageError
from grouppref.pipeline.simulate.config import STAGE, STAGE_VERSION, SimulateConfig
from grouppref.pipeline.simulate.core import check_panel, simulate_group
from grouppref.runs.progress import stage_progress
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import AnnotatedGroup, Reject, from_row


def run_simulate(store: RunStore, config: SimulateConfig,
                 context: StageContext = StageContext()) -> StageRun[AnnotatedGroup]:
    """Add a simulated panel's rankings to the groups of ``config.input_stage``.

    Rows that fail validation, or have no ranking to take the truth from, are rejected with
    the reason. The manifest stats record each annotator's configured and realised flip rate.

    Raises:
        ConfigError: duplicate annotator ids or ``per_group`` larger than the panel.
        StageError: the input stage has not completed.
    """
    check_panel(config)
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
                    records.append(simulate_group(group, config, rng, tally))
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


