"""The ``eval`` stage: the trained model against its starting point on the held-out groups of a
run (or any group dataset), with the metrics of :mod:`grouppref.train.eval.metrics`."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grouppref.errors import ConfigError, StageError
from grouppref.models.loading import load_causal_lm, load_tokenizer, model_fingerprint, model_label
from grouppref.runs.freshness import require_fresh
from grouppref.runs.hashing import sha256_text
from grouppref.runs.manifest import Manifest
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, Shard, StageRun
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.schemas.reports import EvalReport
from grouppref.train.data.reference import ensure_reference
from grouppref.train.data.sources import load_groups
from grouppref.train.data.tokenize import tokenize_groups
from grouppref.train.engine.distributed import process_state
from grouppref.train.eval.metrics import evaluate
from grouppref.train.settings.evaluation import EvalConfig
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.tensors.batch import TokenizedGroup

STAGE = "eval"
STAGE_VERSION = "1"


@dataclass
class Comparison:
    """What :func:`compare_models` found: the report, rejects and the groups scored."""

    report: EvalReport
    rejects: list[Reject]
    used: list[ValidatedGroup]
    inputs: int


def select_split(groups: Sequence[ValidatedGroup], split: str) -> list[ValidatedGroup]:
    """Groups of ``split`` (``train`` includes groups without a split; ``all``: every group)."""
    return [g for g in groups if split == "all" or (g.split or "train") == split]


def compare_models(groups: Sequence[ValidatedGroup], config: EvalConfig, cache_dir: Path,
                   stage: str = "eval") -> Comparison:
    """Score ``config.model`` (and ``config.baseline``) on the groups of ``config.split``.

    Raises:
        ConfigError: no model given.
        StageError: no group in the split, or none left after tokenisation.
    """
    if config.model is None:
        raise ConfigError("eval needs a model: pass --model (a Hub id or folder)")
    chosen = select_split(groups, config.split)
    if not chosen:
        raise StageError(f"no groups in split {config.split!r} among {len(groups)}; "
                         "use --split all (or train)")
    tokenizer = load_tokenizer(config.model)
    tokenized, rejects = tokenize_groups(chosen, tokenizer, config.data, stage=stage)
    if not tokenized:
        raise StageError(f"all {len(chosen)} groups were rejected, e.g. {rejects[0].one_line()}")
    ref_name = config.ref_model or config.baseline
    if ref_name is not None:
        tokenized, _ = ensure_reference(
            tokenized, model_name=ref_name, cache_dir=cache_dir, data_config=config.data,
            batch_size=config.batch_size, pad_token_id=tokenizer.pad_token_id,
            share_prefix=config.share_prefix, dtype=config.dtype)
    scores = {role: _score(name, tokenized, config, tokenizer.pad_token_id)
              for role, name in (("baseline", config.baseline), ("model", config.model))
              if name is not None}
    delta: dict[str, float | None] = (
        {k: scores["model"][k] - v for k, v in scores["baseline"].items() if k != "groups"}
        if len(scores) == 2 else {})
    report = EvalReport(
        split=config.split, groups=len(tokenized), rejected=sum(r.scope == "row" for r in rejects),
        truncated_responses=sum(g.num_truncated for g in tokenized),
        model=model_label(config.model),
        baseline=model_label(config.baseline) if config.baseline else None,
        ref_model=model_label(ref_name) if ref_name else None,
        beta=_beta(config), length_normalise=bool(config.length_normalise),
        metrics={role: dict(m) for role, m in scores.items()}, delta=delta)
    kept = {g.group_id for g in tokenized}
    return Comparison(report=report, rejects=rejects, inputs=len(chosen),
                      used=[g for g in chosen if g.group_id in kept])


def _beta(config: EvalConfig) -> float:
    """The eval's beta, else the training default (one source: TrainConfig)."""
    return config.beta if config.beta is not None else TrainConfig.model_fields["beta"].default


def _score(name: str, groups: list[TokenizedGroup], config: EvalConfig,
           pad_token_id: int) -> dict[str, float]:
    model = load_causal_lm(name, dtype=config.dtype, device=str(process_state().device))
    try:
        return evaluate(model, groups, beta=_beta(config),
                        length_normalise=bool(config.length_normalise),
                        batch_size=config.batch_size, pad_token_id=pad_token_id,
                        share_prefix=config.share_prefix)
    finally:
        del model
        gc.collect()


def resolve_from_train(config: EvalConfig, train: Manifest | None) -> EvalConfig:
    """Fill what ``config`` leaves open from a run's ``train`` manifest: the trained model, its
    starting point as baseline, beta, length normalisation and (unless set) the DataConfig.

    Raises:
        StageError: ``config.model`` is unset and the run has no complete ``train`` stage.
    """
    if train is None or train.status != "complete":
        if config.model is None:
            raise StageError("the run has no complete train stage; run `grouppref train` on "
                             "it first, or pass --model")
        return config
    trained = TrainConfig.model_validate(train.config["train"])
    update: dict[str, Any] = {}
    if config.model is None:
        update["model"] = train.outputs["model"]
        if config.baseline is None:
            update["baseline"] = model_label(trained.model)
    if config.beta is None:
        update["beta"] = trained.beta
    if config.length_normalise is None:
        update["length_normalise"] = trained.length_normalise
    if "data" not in config.model_fields_set:
        update["data"] = trained.data
    return config.model_copy(update=update)


def run_eval(store: RunStore, config: EvalConfig,
             context: StageContext = StageContext()) -> StageRun[ValidatedGroup]:
    """The ``eval`` stage: compare the trained model with its starting point on RUN/validate's
    held-out split; writes ``RUN/eval/metrics.json`` and the groups scored.

    Raises:
        StageError: RUN/validate is missing or stale (or RUN/train is, when it is read; both
            allowed with ``allow_stale``), or there is nothing to evaluate.
    """
    data = load_groups(store.root, stage=STAGE, allow_stale=context.allow_stale)
    resolved = resolve_from_train(config, store.manifest("train"))
    models = [m for m in (resolved.model, resolved.baseline, resolved.ref_model) if m]
    fp = sha256_text("|".join(model_fingerprint(m) for m in models))
    reads = ["validate", *(["train"] if store.is_complete("train") else [])]
    stale = data.stale + [c for c in (require_fresh(store, "train", allow_stale=context.allow_stale,
                                                    use="evaluate it")
                                      if "train" in reads else []) if c not in data.stale]
    if stale:  # an evaluation of stale input is another output: it joins the cache key
        fp = sha256_text(f"{fp}|stale:{','.join(stale)}")
    stage = store.open_stage(STAGE, resolved, input_fingerprint=fp, inputs=reads,
                             record_type=ValidatedGroup,
                             stage_version=STAGE_VERSION, force=context.force)
    if stage.cached:
        return stage
    found = compare_models(data.groups, resolved, cache_dir=stage.dir / "reference")
    shard = Shard(index=0, start=0, items=found.used)
    stage.write_shard(shard, found.used, found.rejects)
    (stage.dir / "metrics.json").write_text(found.report.model_dump_json(indent=2) + "\n")
    return stage.finish(inputs=found.inputs, stats=found.report.model_dump(mode="json"))
