"""The ``train`` stage: train on the groups of a run (``RUN/validate``, refused when stale unless
``allow_stale``) and record ``RUN/train`` (cached like every stage; the model goes to
``RUN/train/model`` unless ``out_dir`` says otherwise), or train on any published dataset
(an export, a Hub id) with :func:`train_dataset` (sources in :mod:`grouppref.train.data.sources`).
Either way the model folder gets its model card (:mod:`grouppref.train.engine.model_folder`).

Under ``torchrun`` / ``accelerate launch`` every process runs the same call; each decides
"cached or not" from the manifest alone, and only the main process writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grouppref.runs.hashing import canonical_json, sha256_text
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.schemas.reports import TrainStats
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
from grouppref.train.policy.model_card import finish_model_folder
from grouppref.train.policy.trainer import train
from grouppref.train.settings.policy import TrainConfig

STAGE = "train"
STAGE_VERSION = "1"
INPUT_STAGE = "validate"


def _stage_config(config: TrainConfig, out_dir: Path) -> dict[str, Any]:
    return {"train": config.model_dump(mode="json"), "out": str(out_dir)}


def run_train(store: RunStore, config: TrainConfig, context: StageContext = StageContext(), *,
              out_dir: str | Path | None = None,
              reference_cache: Path | None = None) -> StageRun[ValidatedGroup]:
    """Train on the run's validated groups (see the module docstring).

    Args:
        store (RunStore): the run; its ``validate`` stage is read.
        config (TrainConfig): the settings.
        context (StageContext): ``force``: train again even when ``RUN/train`` is cached;
            ``resume``: continue from the latest (True) or a given checkpoint; ``allow_stale``:
            train on a stale validate output (the model card says so).
        out_dir (str | Path | None): where the model goes (default ``RUN/train/model``).
        reference_cache (Path | None): reference log-prob cache (default
            ``RUN/train/reference``).

    Returns:
        StageRun[ValidatedGroup]: the groups used; ``manifest.stats`` are the training
        metrics, ``manifest.outputs["model"]`` the model folder.

    Raises:
        StageError: validate has not run, is stale, or no group is trainable.
    """
    data = load_groups(store.root, allow_stale=context.allow_stale)
    out = Path(out_dir) if out_dir is not None else store.stage_dir(STAGE) / "model"
    settings = _stage_config(config, out)
    # a model trained on stale data carries a card that says so: another output, another key
    marker = sha256_text(canonical_json({"stale": data.stale})) if data.stale else ""
    if context.resume:  # a missing or incompatible checkpoint fails before the stage is touched
        checkpoint.check_compatible(checkpoint.find(out, context.resume), config)
    stage = open_training_stage(store, STAGE, settings, marker, STAGE_VERSION,
                                reuse=not context.force and not context.resume)
    if stage is not None and stage.cached:
        return stage
    result = train(config, data.groups, out, resume=context.resume,
                   reference_cache=reference_cache or store.stage_dir(STAGE) / "reference",
                   refresh_dir=store.stage_dir(STAGE) / "refresh")
    if stage is not None:
        finish_model_folder(out, config, result.stats,
                            trained_on(str(store.root), "run", store, data.stale))
        record_training(stage, data, result.used, result.rejects,
                        result.stats.model_dump(mode="json"), out)
    return training_stage_result(store, STAGE, stage)


@dataclass
class TrainOutcome:
    """What :func:`train_dataset` did: its stats, where the model is, counts and rejects."""

    stats: TrainStats
    out_dir: Path
    counts: dict[str, int]
    rejects: list[Reject]


def train_dataset(source: str | Path, config: TrainConfig, out_dir: str | Path, *,
                  resume: bool | str | Path = False,
                  reference_cache: Path | None = None) -> TrainOutcome:
    """Train on a published dataset or Hub id (not a run): the model, its card, ``rejects.jsonl``
    (reading + tokenising) and ``source.json`` go to ``out_dir``."""
    data = load_groups(source)
    out = Path(out_dir)
    result = train(config, data.groups, out, resume=resume, reference_cache=reference_cache)
    rejects = data.rejects + result.rejects
    counts = publish_source(out, data, rejects)
    if process_state().is_main_process:
        finish_model_folder(out, config, result.stats, trained_on(
            data.source, data.format, unreadable=sum(r.scope == "row" for r in data.rejects)))
    counts["outputs"] = len(result.used)
    return TrainOutcome(stats=result.stats, out_dir=out, counts=counts, rejects=rejects)
