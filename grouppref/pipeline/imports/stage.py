"""``generate --import``: build candidate groups from responses produced elsewhere and store them
as the run's ``generate`` stage (same records as sampled groups, ``source.kind = "import"``).

Accepted layouts (see :func:`grouppref.readers.rows.read_groups`): one row per prompt with a
list of responses (strings or ``{text, model}`` objects), or one row per response with the
prompt columns repeated (rows with the same prompt form a group, in file order). Empty and
duplicate responses are left out as part-rejects; groups with fewer than ``min_k`` distinct
responses are rejected with the reason.
"""

from __future__ import annotations

from pathlib import Path

from grouppref.pipeline.imports.config import STAGE, STAGE_VERSION, ImportConfig
from grouppref.readers.groups import read_groups
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import CandidateGroup, Reject


def run_import(store: RunStore, config: ImportConfig, force: bool = False) -> StageRun[CandidateGroup]:
    """Read ``config.source`` into ``RUN/generate``; bad rows go to rejects with their reason.

    Raises:
        InputFileError: the source is missing, unreadable or empty.
    """
    result = read_groups(config.source, config.mapping, stage=STAGE, split=config.split)
    cfg = config.model_copy(update={"source": str(Path(config.source))})
    stage = store.open_stage(STAGE, cfg, input_fingerprint=result.fingerprint,
                             record_type=CandidateGroup, stage_version=STAGE_VERSION, force=force)
    if stage.cached:
        return stage
    kept: list[CandidateGroup] = []
    rejects = list(result.rejects)
    for group in result.items:
        if group.k < config.min_k:
            rejects.append(Reject(stage=STAGE, group_id=group.group_id, field="responses",
                                  source=result.source,
                                  reason=f"only {group.k} distinct responses; --min-k is "
                                  f"{config.min_k}"))
        else:
            kept.append(group)
    stage.add_rejects("input", rejects)
    for shard in stage.pending_shards(kept, shard_size=max(len(kept), 1)):
        stage.write_shard(shard, list(shard.items), [])
    models = sorted({c.source.model for g in kept for c in g.candidates if c.source.model})
    return stage.finish(inputs=result.rows, stats={
        "source": result.source, "candidates": sum(g.k for g in kept), "models": models})
