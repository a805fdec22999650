"""The ``prompts`` stage: read a prompt file, validate every row, store the prompts in a run."""

from __future__ import annotations

from pathlib import Path

from grouppref.pipeline.prompts.config import STAGE, STAGE_VERSION, PromptsConfig
from grouppref.pipeline.prompts.parallel import plan, read_parallel
from grouppref.readers.lines import LineRange
from grouppref.readers.prompts import read_prompts
from grouppref.readers.rows import source_fingerprint, source_kind
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import Prompt


def run_prompts(store: RunStore, config: PromptsConfig,
                context: StageContext = StageContext()) -> StageRun[Prompt]:
    """Read ``config.source`` into ``RUN/prompts``; bad rows go to rejects with their reason.
    The source is read only when the stage is not cached (its fingerprint comes first)."""
    source_kind(config.source)  # a missing file or unknown format: before the run is touched
    fingerprint = source_fingerprint(str(config.source))
    cfg = config.model_copy(update={"source": str(Path(config.source))})
    stage = store.open_stage(STAGE, cfg, input_fingerprint=fingerprint, record_type=Prompt,
                             stage_version=STAGE_VERSION, force=context.force)
    if stage.cached:
        return stage
    ranges = plan(config)
    if ranges is not None:  # a large file: its parts read on several cores
        return _read_in_parts(stage, config, ranges)
    result = read_prompts(config.source, config.mapping, stage=STAGE, split=config.split,
                          limit=config.limit, fingerprint=fingerprint)
    stage.add_rejects("input", result.rejects)
    for shard in stage.pending_shards(result.items, shard_size=max(len(result.items), 1)):
        stage.write_shard(shard, list(shard.items), [])
    return stage.finish(inputs=result.rows, stats={"source": str(config.source)})


def _read_in_parts(stage: StageRun[Prompt], config: PromptsConfig,
                   ranges: list[LineRange]) -> StageRun[Prompt]:
    """The stage from :func:`.parallel.read_parallel` (its files in :meth:`StageRun.scratch`)."""
    with stage.scratch() as scratch:
        got = read_parallel(config, ranges, scratch)
    stage.add_rejects("input", got.rejects)
    rows = range(got.table.num_rows)
    for shard in stage.pending_shards(rows, shard_size=max(len(rows), 1)):
        stage.write_table(shard, got.table.slice(shard.start, len(shard.items)), [])
    return stage.finish(inputs=got.rows, stats={"source": str(config.source)})
