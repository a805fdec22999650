"""The stages of a run, in order: the one registry.

Each entry is a stage's :class:`~grouppref.runs.stage.StageSpec` (declared next to its settings
in its package's ``config`` module), the :class:`~grouppref.runner.RunConfig` field that
configures it, and its run function, imported on first use by a plain import statement (the
stage modules import torch; this module and the specs do not, so ``--help``, ``inspect`` and a
config check stay light). Every run function has one call shape,
``run(store, config, context)`` (:class:`~grouppref.runs.stage.StageContext`).

Everything else that knows the stages derives from :data:`STAGES`: the order of
``grouppref run`` (:mod:`grouppref.runner`), the names ``--from``/``--until``/``--force``
accept, the order ``grouppref inspect`` lists a run's stages in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grouppref.errors import ConfigError
from grouppref.labeling.config import LABEL
from grouppref.pipeline.aggregate.config import AGGREGATE
from grouppref.pipeline.export.config import EXPORT
from grouppref.pipeline.generate.config import GENERATE
from grouppref.pipeline.imports.config import IMPORT
from grouppref.pipeline.prompts.config import PROMPTS
from grouppref.pipeline.rank.config import RANK
from grouppref.pipeline.report.config import REPORT
from grouppref.pipeline.simulate.config import SIMULATE
from grouppref.pipeline.validate.config import VALIDATE
from grouppref.runs.stage import StageFunction, StageSpec
from grouppref.sweep.config import SWEEP
from grouppref.train.settings.evaluation import EVAL
from grouppref.train.settings.policy import TRAIN
from grouppref.train.settings.reward_model import TRAIN_RM


# -- the run functions, imported on first use -------------------------------------------------
def _prompts() -> StageFunction:
    from grouppref.pipeline.prompts.stage import run_prompts

    return run_prompts


def _generate() -> StageFunction:
    from grouppref.pipeline.generate.stage import run_generate

    return run_generate


def _import() -> StageFunction:
    from grouppref.pipeline.imports.stage import run_import

    return run_import


def _rank() -> StageFunction:
    from grouppref.pipeline.rank.stage import run_rank

    return run_rank


def _simulate() -> StageFunction:
    from grouppref.pipeline.simulate.stage import run_simulate

    return run_simulate


def _label() -> StageFunction:
    from grouppref.labeling.stage import run_label

    return run_label


def _aggregate() -> StageFunction:
    from grouppref.pipeline.aggregate.stage import run_aggregate

    return run_aggregate


def _validate() -> StageFunction:
    from grouppref.pipeline.validate.stage import run_validate

    return run_validate


def _export() -> StageFunction:
    from grouppref.pipeline.export.stage import run_export

    return run_export


def _train_rm() -> StageFunction:
    from grouppref.train.reward_model.stage import run_train_rm

    return run_train_rm


def _sweep() -> StageFunction:
    from grouppref.sweep.run import run_sweep_stage

    return run_sweep_stage


def _train() -> StageFunction:
    from grouppref.train.policy.stage import run_train

    return run_train


def _eval() -> StageFunction:
    from grouppref.train.eval.stage import run_eval

    return run_eval


def _report() -> StageFunction:
    from grouppref.pipeline.report.stage import run_report

    return run_report


@dataclass(frozen=True)
class Stage:
    """One entry of the registry: the stage, the run config's field for it, its function."""

    spec: StageSpec[Any]
    section: str  # the RunConfig field that configures it (None or [] there: not in the run)
    load: Callable[[], StageFunction]  # its run function (imports the stage's module)

    @property
    def name(self) -> str:
        """Its folder in the run and the name ``--from``/``--until``/``--force`` use."""
        return self.spec.name


STAGES: tuple[Stage, ...] = (
    Stage(PROMPTS, "prompts", _prompts),
    Stage(GENERATE, "generate", _generate),
    Stage(IMPORT, "import_", _import),
    Stage(RANK, "rank", _rank),
    Stage(SIMULATE, "simulate", _simulate),
    Stage(LABEL, "label", _label),
    Stage(AGGREGATE, "aggregate", _aggregate),
    Stage(VALIDATE, "validation", _validate),
    Stage(EXPORT, "export", _export),
    Stage(TRAIN_RM, "train_rm", _train_rm),
    Stage(SWEEP, "sweep", _sweep),
    Stage(TRAIN, "train", _train),
    Stage(EVAL, "eval", _eval),
    Stage(REPORT, "report", _report),
)
NAMES: tuple[str, ...] = tuple(stage.name for stage in STAGES)


def stage_named(name: str) -> Stage:
    """The registry's entry for ``name``.

    Raises:
        ConfigError: no stage has that name (the message lists them).
    """
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise ConfigError(f"unknown stage {name!r}; one of {', '.join(NAMES)}")


def position(stage_folder: str) -> int:
    """Where a run's stage folder (``export/<target>`` counts as ``export``) comes in the
    order; a folder that is no stage comes last."""
    head = stage_folder.split("/")[0]
    return NAMES.index(head) if head in NAMES else len(NAMES)
