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

The research experiments (``research/``) use the product only through this module
(tests/integration/test_architecture.py): what they need below the stages (statistics, model
loading and sampling, the rule checks, label selection, the pieces of a training loop) is
published here too, grouped below.
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
    # records built by hand (research scripts, tests): a candidate's provenance and the stable
    # ids the stages give a group and a candidate
    **{name: "grouppref.schemas" for name in ("CandidateSource", "make_group_id", "make_candidate_id")},
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
    **{name: "grouppref.pipeline.simulate.panel" for name in ("tied_panel", "TiedPanel")},
    **{name: "grouppref.pipeline.aggregate.core" for name in (
        "aggregate_groups", "Aggregated", "collect_groups", "fit_parsed", "Aggregation",
        "encode_rankings", "fit_groups", "BTFit")},
    **{name: "grouppref.pipeline.validate.core" for name in (
        "validate_groups", "Validated", "split_of")},
    # the rule ranker on its own and its constraint checks (``make_constraint(id, kwargs)``,
    # ``constraint_met(constraint, text)``; ``parse_constraints`` reads a prompt's list, ``satisfaction``
    # scores a text against it), the checks an evaluation of instruction following reuses
    "RuleRanker": "grouppref.pipeline.rank.rankers",
    "RuleRankerSettings": "grouppref.pipeline.rank.settings",
    **{name: "grouppref.pipeline.rank.constraints" for name in (
        "make_constraint", "parse_constraints", "constraint_met", "satisfaction")},
    # choosing groups for human ranking (``label push --select``): its settings and the choice
    # itself on records, no server
    "PushConfig": "grouppref.labeling.config",
    **{name: "grouppref.labeling.select" for name in ("select_groups", "split_budget")},
    # the statistics under aggregation (import torch): Bradley-Terry on rankings, consensus
    # targets and tier strengths, annotator reliability and the noise estimate
    **{name: "grouppref.stats.bt" for name in (
        "wins_rankings", "map_pairwise", "probabilities_pairwise", "covariance_pairwise",
        "confidence_pairwise")},
    **{name: "grouppref.stats.rankstats" for name in ("consensus_targets", "tiers_strengths")},
    **{name: "grouppref.stats.reliability" for name in (
        "estimate_reliability", "noise_rate", "pairwise_agreement", "log_odds_weight")},
    "flip_rates_moment": "grouppref.stats.noise",
    # models (import torch): a name or path resolved to a local folder (the embedded SmolLM2
    # converted from its GGUF once), loading, and the sampler generate uses
    **{name: "grouppref.models.loading" for name in (
        "resolve_model", "convert_gguf", "load_causal_lm", "load_tokenizer")},
    **{name: "grouppref.models.sampling" for name in (
        "sample_batch", "neutral_generation_config", "gumbel_argmax", "left_pad")},
    "derive_seed": "grouppref.models.seeds",
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
    # what such a loop builds its batches from: groups tokenized and split as train does
    # (``split_groups``), collated into tensors, scored (``group_logps``), drawn from mixed
    # sources (``MixSampler`` with ``MixConfig``) and, with refresh, from the fresh-group buffer
    "split_groups": "grouppref.train.policy.setup",
    **{name: "grouppref.train.tensors.batch" for name in (
        "TokenizedGroup", "GroupBatch", "collate_groups")},
    "group_logps": "grouppref.train.tensors.logps",
    "MixSampler": "grouppref.train.policy.mix_sampler",
    "MixConfig": "grouppref.train.settings.mix",
    **{name: "grouppref.train.refresh.buffer" for name in ("FreshBuffer", "RhoStats", "mix_batch")},
    "round_prompts": "grouppref.train.refresh.fresh_groups",
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
    from grouppref.labeling.config import PushConfig
    from grouppref.labeling.select import select_groups, split_budget
    from grouppref.models.loading import convert_gguf, load_causal_lm, load_tokenizer, resolve_model
    from grouppref.models.sampling import gumbel_argmax, left_pad, neutral_generation_config, sample_batch
    from grouppref.models.seeds import derive_seed
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
    from grouppref.pipeline.rank.constraints import (
        constraint_met,
        make_constraint,
        parse_constraints,
        satisfaction,
    )
    from grouppref.pipeline.rank.core import Ranked, rank_groups
    from grouppref.pipeline.rank.rankers import RuleRanker, build_ranker
    from grouppref.pipeline.rank.settings import RuleRankerSettings
    from grouppref.pipeline.rank.shard_scoring import ShardScorer
    from grouppref.pipeline.rank.stage import run_rank
    from grouppref.pipeline.report.config import ReportConfig
    from grouppref.pipeline.report.stage import run_report
    from grouppref.pipeline.simulate.config import AnnotatorSpec, SimulateConfig
    from grouppref.pipeline.simulate.core import Simulated, order_flips, simulate_groups, simulate_order
    from grouppref.pipeline.simulate.panel import TiedPanel, tied_panel
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
        CandidateSource,
        ChatMessage,
        PairPreference,
        Prompt,
        Ranking,
        Reject,
        ValidatedGroup,
        make_candidate_id,
        make_group_id,
    )
    from grouppref.stats.bt import (
        confidence_pairwise,
        covariance_pairwise,
        map_pairwise,
        probabilities_pairwise,
        wins_rankings,
    )
    from grouppref.stats.noise import flip_rates_moment
    from grouppref.stats.rankstats import consensus_targets, tiers_strengths
    from grouppref.stats.reliability import (
        estimate_reliability,
        log_odds_weight,
        noise_rate,
        pairwise_agreement,
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
    from grouppref.train.policy.mix_sampler import MixSampler
    from grouppref.train.policy.setup import split_groups
    from grouppref.train.policy.stage import run_train
    from grouppref.train.policy.step import Objective, run_steps
    from grouppref.train.policy.trainer import train
    from grouppref.train.refresh.buffer import FreshBuffer, RhoStats, mix_batch
    from grouppref.train.refresh.fresh_groups import round_prompts
    from grouppref.train.reward_model.stage import run_train_rm
    from grouppref.train.settings.evaluation import EvalConfig
    from grouppref.train.settings.mix import MixConfig
    from grouppref.train.settings.policy import TrainConfig
    from grouppref.train.settings.reward_model import RewardModelConfig
    from grouppref.train.settings.shared import DataConfig
    from grouppref.train.tensors.batch import GroupBatch, TokenizedGroup, collate_groups
    from grouppref.train.tensors.logps import group_logps
