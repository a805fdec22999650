"""The public Python API: every stage, its settings and the records, from one module.

    from grouppref import api

    store = api.RunStore("runs/mine")
    api.run_generate(store, api.GenerateConfig(source="data/demo_prompts.jsonl", k=4))
    api.run_rank(store, api.RankConfig(rankers=[{"kind": "rule", "checks": [{"check": "verify"}]}]))
    api.run_aggregate(store, api.AggregateConfig(input_stage="rank", min_rankings=1))
    groups = api.run_validate(store, api.ValidateConfig()).records()   # list[ValidatedGroup]
    result = api.train(api.TrainConfig(loss="lipo", max_steps=8), groups, "runs/mine/model")

Besides the stages, each stage's *core* is here: the same work on typed records with no run
store (``sample_groups``, ``rank_groups``, ``simulate_groups``, ``aggregate_groups``,
``validate_groups``), e.g. ``api.aggregate_groups(groups, api.AggregateConfig())`` returns an
``api.Aggregated`` (``ValidatedGroup`` records, rejects, the report).

Names resolve on first use (PEP 562), so ``import grouppref.api`` stays light: the stage
modules, and torch with the training names, load only when a name that needs them is read.
Each name is the object of the module listed in :data:`EXPORTS`, the same one the CLI and
``grouppref run`` call; nothing here wraps or copies them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> module that defines it
EXPORTS: dict[str, str] = {
    # the run store, and how a stage runs this time (force, allow_stale, resume, ...)
    "RunStore": "grouppref.runs.store",
    "StageContext": "grouppref.runs.stage",
    # records (pydantic v2)
    **{name: "grouppref.schemas" for name in (
        "Prompt", "ChatMessage", "Candidate", "CandidateGroup", "Ranking", "Annotator",
        "AnnotatedGroup", "PairPreference", "ValidatedGroup", "Reject")},
    # stages and their settings, in pipeline order
    "PromptsConfig": "grouppref.pipeline.prompts.config",
    "run_prompts": "grouppref.pipeline.prompts.stage",
    "ImportConfig": "grouppref.pipeline.imports.config",
    "run_import": "grouppref.pipeline.imports.stage",
    "GenerateConfig": "grouppref.pipeline.generate.config",
    "ModelShare": "grouppref.pipeline.generate.config",
    "run_generate": "grouppref.pipeline.generate.stage",
    "RankConfig": "grouppref.pipeline.rank.config",
    "run_rank": "grouppref.pipeline.rank.stage",
    "SimulateConfig": "grouppref.pipeline.simulate.config",
    "run_simulate": "grouppref.pipeline.simulate.stage",
    "AggregateConfig": "grouppref.pipeline.aggregate.config",
    "run_aggregate": "grouppref.pipeline.aggregate.stage",
    "ValidateConfig": "grouppref.pipeline.validate.config",
    "run_validate": "grouppref.pipeline.validate.stage",
    "ExportConfig": "grouppref.pipeline.export.config",
    "run_export": "grouppref.pipeline.export.stage",
    "ReportConfig": "grouppref.pipeline.report.config",
    "run_report": "grouppref.pipeline.report.stage",
    # the stages' cores: typed records in, typed records out, no run store (the stages above
    # call them between reading and writing the run)
    **{name: "grouppref.pipeline.generate.core" for name in (
        "sample_groups", "Sampled", "prompt_encoder", "context_length")},
    **{name: "grouppref.pipeline.rank.core" for name in ("rank_groups", "Ranked")},
    "ShardScorer": "grouppref.pipeline.rank.shard_scoring",
    "build_ranker": "grouppref.pipeline.rank.rankers",
    "AnnotatorSpec": "grouppref.pipeline.simulate.config",
    **{name: "grouppref.pipeline.simulate.core" for name in (
        "simulate_groups", "Simulated", "simulate_order", "order_flips")},
    **{name: "grouppref.pipeline.aggregate.core" for name in (
        "aggregate_groups", "Aggregated", "collect_groups", "fit_parsed", "Aggregation",
        "encode_rankings", "fit_groups", "BTFit")},
    **{name: "grouppref.pipeline.validate.core" for name in (
        "validate_groups", "Validated", "split_of")},
    # a whole config-driven run
    "RunConfig": "grouppref.runner",
    "run_pipeline": "grouppref.runner",
    # training and evaluation (import torch)
    "TrainConfig": "grouppref.train.settings.policy",
    "DataConfig": "grouppref.train.settings.shared",
    "EvalConfig": "grouppref.train.settings.evaluation",
    "RewardModelConfig": "grouppref.train.settings.reward_model",
    "run_train": "grouppref.train.policy.stage",
    "run_train_rm": "grouppref.train.reward_model.stage",
    "train": "grouppref.train.policy.trainer",
    "load_groups": "grouppref.train.data.sources",
    # the policy trainer's optimizer steps over batches one builds oneself (research loops)
    **{name: "grouppref.train.policy.step" for name in ("run_steps", "Objective")},
    # the losses, pure functions over implicit rewards
    **{name: "grouppref.train.objective.losses" for name in (
        "implicit_rewards", "gspo_loss", "hard_pair_targets", "plackett_luce_loss", "dpo_loss",
        "sft_loss", "importance_weights", "pair_accuracy")},
    **{name: "grouppref.train.objective.listwise" for name in (
        "lipo_lambda_loss", "nca_loss", "infonca_loss", "soft_targets")},
}

__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> Any:
    module = EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'grouppref.api' has no attribute {name!r}; its names: "
                             f"{', '.join(__all__)}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # the names for type checkers and editors
    from grouppref.pipeline.aggregate.config import AggregateConfig
    from grouppref.pipeline.aggregate.core import (
        Aggregated,
        Aggregation,
        BTFit,
        aggregate_groups,
        collect_groups,
        encode_rankings,
        fit_groups,
        fit_parsed,
    )
    from grouppref.pipeline.aggregate.stage import run_aggregate
    from grouppref.pipeline.export.config import ExportConfig
    from grouppref.pipeline.export.stage import run_export
    from grouppref.pipeline.generate.config import GenerateConfig, ModelShare
    from grouppref.pipeline.generate.core import Sampled, context_length, prompt_encoder, sample_groups
    from grouppref.pipeline.generate.stage import run_generate
    from grouppref.pipeline.imports.config import ImportConfig
    from grouppref.pipeline.imports.stage import run_import
    from grouppref.pipeline.prompts.config import PromptsConfig
    from grouppref.pipeline.prompts.stage import run_prompts
    from grouppref.pipeline.rank.config import RankConfig
    from grouppref.pipeline.rank.core import Ranked, rank_groups
    from grouppref.pipeline.rank.rankers import build_ranker
    from grouppref.pipeline.rank.shard_scoring import ShardScorer
    from grouppref.pipeline.rank.stage import run_rank
    from grouppref.pipeline.report.config import ReportConfig
    from grouppref.pipeline.report.stage import run_report
    from grouppref.pipeline.simulate.config import AnnotatorSpec, SimulateConfig
    from grouppref.pipeline.simulate.core import Simulated, order_flips, simulate_groups, simulate_order
    from grouppref.pipeline.simulate.stage import run_simulate
    from grouppref.pipeline.validate.config import ValidateConfig
    from grouppref.pipeline.validate.core import Validated, split_of, validate_groups
    from grouppref.pipeline.validate.stage import run_validate
    from grouppref.runner import RunConfig, run_pipeline
    from grouppref.runs.stage import StageContext
    from grouppref.runs.store import RunStore
    from grouppref.schemas import (
        AnnotatedGroup,
        Annotator,
        Candidate,
        CandidateGroup,
        ChatMessage,
        PairPreference,
        Prompt,
        Ranking,
        Reject,
        ValidatedGroup,
    )
    from grouppref.train.data.sources import load_groups
    from grouppref.train.objective.listwise import infonca_loss, lipo_lambda_loss, nca_loss, soft_targets
    from grouppref.train.objective.losses import (
        dpo_loss,
        gspo_loss,
        hard_pair_targets,
        implicit_rewards,
        importance_weights,
        pair_accuracy,
        plackett_luce_loss,
        sft_loss,
    )
    from grouppref.train.policy.stage import run_train
    from grouppref.train.policy.step import Objective, run_steps
    from grouppref.train.policy.trainer import train
    from grouppref.train.reward_model.stage import run_train_rm
    from grouppref.train.settings.evaluation import EvalConfig
    from grouppref.train.settings.policy import TrainConfig
    from grouppref.train.settings.reward_model import RewardModelConfig
    from grouppref.train.settings.shared import DataConfig
