"""The ``prompts`` stage: read a prompt file, validate every row, store the prompts in a run."""

from __future__ import annotations

from pathlib import Path

from grouppref.pipeline.prompts.config import STAGE, STAGE_VERSION, PromptsConfig
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
    result = read_prompts(config.source, config.mapping, stage=STAGE, split=config.split,
                          limit=config.limit, fingerprint=fingerprint)
    stage.add_rejects("input", result.rejects)
    for shard in stage.pending_shards(result.items, shard_size=max(len(result.items), 1)):
        stage.write_shard(shard, list(shard.items), [])
    return stage.finish(inputs=result.rows, stats={"source": result.source})
