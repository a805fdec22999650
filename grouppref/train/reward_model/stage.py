"""The ``train_rm`` stage: a reward model trained on the groups of a run (``RUN/validate``,
refused when stale unless ``allow_stale``), recorded in ``RUN/train_rm`` and cached like every
stage (model in ``RUN/train_rm/model`` unless ``out_dir`` says otherwise); or trained on any
published dataset with :func:`train_rm_dataset`. Either way the model folder holds the model,
its tokenizer, ``metrics.json``, ``metrics.jsonl`` and a model card (``README.md``) naming the
data and its fingerprint, the loss, the steps and the held-out pair accuracy. It loads as
``grouppref rank --ranker reward:DIR``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grouppref.runs.hashing import canonical_json, sha256_text
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.schemas.reports import RewardModelStats
from grouppref.train.data.sources import (
    load_groups,
    open_training_stage,
    publish_source,
    record_training,
    training_stage_result,
)
from grouppref.train.engine import checkpoint
from grouppref.train.engine.distributed import process_state
from grouppref.train.engine.model_folder import trained_on
from grouppref.train.reward_model.model_card import finish_rm_folder
from grouppref.train.settings.reward_model import RewardModelConfig

STAGE = "train_rm"
STAGE_VERSION = "1"
INPUT_STAGE = "validate"


def _settings(config: RewardModelConfig, out_dir: Path) -> dict[str, Any]:
    return {"train_rm": config.model_dump(mode="json"), "out": str(out_dir)}


def run_train_rm(store: RunStore, config: RewardModelConfig,
                 context: StageContext = StageContext(), *,
                 out_dir: str | Path | None = None) -> StageRun[ValidatedGroup]:
    """Train a reward model on the run's validated groups (module docstring); ``context.resume``
    (``True``: the newest checkpoint in the model folder, or a checkpoint folder) continues an
    interrupted training instead of starting again (never answered from the cache).

    Returns:
        StageRun[ValidatedGroup]: the groups used; ``manifest.stats`` a
        :class:`RewardModelStats`, ``manifest.outputs["model"]`` the model folder.

    Raises:
        StageError: validate has not run, is stale, or no group is trainable.
    """
    from grouppref.models.loading import model_fingerprint
    from grouppref.train.reward_model.trainer import train_reward_model

    fingerprint = model_fingerprint(config.model)  # an unknown model fails before the data
    data = load_groups(store.root, stage=STAGE, allow_stale=context.allow_stale)
    out = Path(out_dir) if out_dir is not None else store.stage_dir(STAGE) / "model"
    settings = _settings(config, out)
    key = sha256_text(canonical_json({"model": fingerprint,
                                      "stale": data.stale}))
    if context.resume:  # a missing or incompatible checkpoint fails before the stage is touched
        checkpoint.check_compatible(checkpoint.find(out, context.resume), config)
    stage = open_training_stage(store, STAGE, settings, key, STAGE_VERSION,
                                reuse=not context.force and not context.resume)
    if stage is not None and stage.cached:
        return stage
    result = train_reward_model(config, data.groups, out, resume=context.resume)
    if stage is not None:
        stats = result.stats.model_copy(update={"data_fingerprint": data.fingerprint})
        finish_rm_folder(out, config, stats, trained_on(str(store.root), "run", store,
                                                        data.stale))
        record_training(stage, data, result.used, result.rejects,
                        stats.model_dump(mode="json", exclude_none=True), out)
    return training_stage_result(store, STAGE, stage)


@dataclass
class RewardModelOutcome:
    """What :func:`train_rm_dataset` did."""

    stats: RewardModelStats
    out_dir: Path
    counts: dict[str, int]
    rejects: list[Reject]


def train_rm_dataset(source: str | Path, config: RewardModelConfig, out_dir: str | Path, *,
                     resume: bool | str | Path = False) -> RewardModelOutcome:
    """Train on a published dataset or Hub id (not a run); ``rejects.jsonl`` and
    ``source.json`` go into ``out_dir`` with the model; ``resume`` as ``context.resume`` in
    :func:`run_train_rm`."""
    from grouppref.models.loading import resolve_model
    from grouppref.train.reward_model.trainer import train_reward_model

    resolve_model(config.model)  # an unknown model fails before the data is read
    data = load_groups(source, stage=STAGE)
    out = Path(out_dir)
    result = train_reward_model(config, data.groups, out, resume=resume)
    rejects = data.rejects + result.rejects
    stats = result.stats.model_copy(update={"data_fingerprint": data.fingerprint})
    counts = publish_source(out, data, rejects)
    if process_state().is_main_process:
        finish_rm_folder(out, config, stats, trained_on(
            data.source, data.format, unreadable=sum(r.scope == "row" for r in data.rejects)))
    counts["outputs"] = len(result.used)
    return RewardModelOutcome(stats=stats, out_dir=out, counts=counts, rejects=rejects)
