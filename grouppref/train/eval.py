"""Preference metrics of a model on tokenized groups, and the ``eval`` stage.

Two families of numbers, both against the consensus of the aggregated rankings:

* reward metrics (need reference log-probs): the implicit reward
  ``s_i = β · (log πθ(y_i|x) − log πref(y_i|x))`` and

  - ``pair_accuracy``: weighted share of decided consensus pairs that s orders right (ties ½),
  - ``margin``: ``Σ w_ij·(s_i − s_j) / Σ w_ij`` over decided pairs oriented winner − loser,
  - ``reward_best`` / ``reward_worst``: s of the consensus best and worst candidate,
  - ``kl``: a per-token KL estimate to the reference, ``k3 = e^r − 1 − r`` with
    ``r = (log πref − log πθ) / n`` per candidate, averaged over candidates. It is unbiased for
    KL(πθ‖πref) only when the candidates were sampled from πθ; on offline data it measures how
    far the policy has moved on the data.

* likelihood metrics (any model): the same ordering scored by the model's own mean token
  log-prob ``log π(y_i|x) / n_i``: ``logp_pair_accuracy`` and ``logp_margin``. They compare a
  trained model with its starting point, whose implicit rewards are all 0 (accuracy ½).

Every metric is a mean over groups (pair accuracy over groups with a decided pair).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grouppref.errors import ConfigError, StageError
from grouppref.models.loading import load_causal_lm, load_tokenizer, model_fingerprint, model_label
from grouppref.runs.freshness import require_fresh
from grouppref.runs.hashing import sha256_text
from grouppref.runs.manifest import Manifest
from grouppref.runs.store import RunStore, Shard, StageRun
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.schemas.reports import EvalReport
from grouppref.train.config import EvalConfig, TrainConfig
from grouppref.train.data import GroupBatch, TokenizedGroup, collate_groups, tokenize_groups
from grouppref.train.distributed import process_state
from grouppref.train.logps import group_logps
from grouppref.train.losses import best_worst, implicit_rewards, pair_accuracy
from grouppref.train.reference import ensure_reference
from grouppref.train.sources import load_groups

Tensor = torch.Tensor
STAGE = "eval"
STAGE_VERSION = "1"


def pair_margin(s: Tensor, p_ij: Tensor, w_ij: Tensor, valid: Tensor) -> Tensor:
    """Confidence-weighted mean margin of the decided pairs, winner minus loser.

    ``m = Σ_{i,j: p_ij > ½} w_ij·(s_i − s_j) / Σ_{i,j: p_ij > ½} w_ij``

    Args:
        s (Tensor): scores, shape (B, K).
        p_ij (Tensor): P(i ≻ j), shape (B, K, K).
        w_ij (Tensor): pair confidence, shape (B, K, K).
        valid (Tensor): bool, shape (B, K).

    Returns:
        Tensor: shape (B,), NaN for a group without a decided pair; detached.
    """
    s = s.detach()
    won = (p_ij > 0.5) & valid[:, :, None] & valid[:, None, :] & (w_ij > 0)  # (B, K, K)
    w = w_ij * won
    margin = s[:, :, None] - s[:, None, :]  # (B, K, K)
    return (w * margin).sum(dim=(1, 2)) / w.sum(dim=(1, 2))


def kl_estimate(policy_logps: Tensor, ref_logps: Tensor, num_tokens: Tensor,
                valid: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(πθ‖πref), averaged over each group's candidates.

    ``r_i = (log πref(y_i|x) − log πθ(y_i|x)) / n_i``, ``k3_i = exp(r_i) − 1 − r_i ≥ 0``.

    Args:
        policy_logps (Tensor): summed log-probs, shape (B, K).
        ref_logps (Tensor): the same under the reference, shape (B, K).
        num_tokens (Tensor): response lengths, shape (B, K).
        valid (Tensor): bool, shape (B, K).

    Returns:
        Tensor: shape (B,), detached.
    """
    r = (ref_logps - policy_logps.detach()) / num_tokens.clamp(min=1)  # (B, K)
    k3 = (r.exp() - 1 - r) * valid
    return k3.sum(dim=1) / valid.sum(dim=1).clamp(min=1)


def reward_metrics(policy_logps: Tensor, batch: GroupBatch, beta: float,
                   length_normalise: bool = False,
                   reference_free: bool = False) -> dict[str, Tensor]:
    """Implicit-reward metrics of one batch, one value per group (see the module docstring);
    with ``reference_free`` of the rewards ``beta * log pi [/ n]``, and no ``kl``.

    Args:
        policy_logps (Tensor): summed log-probs under the policy, shape (B, K).
        batch (GroupBatch): the groups, with ``ref_logps``.
        beta (float): implicit reward scale.
        length_normalise (bool): divide log-ratios by the token count.
        reference_free (bool): rewards without the reference (``batch.ref_logps`` unread).

    Returns:
        dict[str, Tensor]: ``pair_accuracy``, ``margin``, ``reward_best``, ``reward_worst``,
        ``kl`` (not with ``reference_free``), each shape (B,), detached.
    """
    s = implicit_rewards(policy_logps.detach(), batch.ref_logps, beta, batch.num_tokens,
                         length_normalise, reference_free)  # (B, K)
    best, worst = best_worst(batch.order, batch.valid)
    out = {
        "pair_accuracy": pair_accuracy(s, batch.p_ij, batch.w_ij, batch.valid),
        "margin": pair_margin(s, batch.p_ij, batch.w_ij, batch.valid),
        "reward_best": s.gather(1, best[:, None])[:, 0],
        "reward_worst": s.gather(1, worst[:, None])[:, 0],
    }
    if not reference_free:
        out["kl"] = kl_estimate(policy_logps, batch.ref_logps, batch.num_tokens, batch.valid)
    return out


def likelihood_metrics(policy_logps: Tensor, batch: GroupBatch) -> dict[str, Tensor]:
    """Pair accuracy and margin of the model's own mean token log-prob, per group (B,)."""
    own = policy_logps.detach() / batch.num_tokens.clamp(min=1)  # (B, K)
    return {
        "logp_pair_accuracy": pair_accuracy(own, batch.p_ij, batch.w_ij, batch.valid),
        "logp_margin": pair_margin(own, batch.p_ij, batch.w_ij, batch.valid),
    }


class MetricSums:
    """Running NaN-aware sums of per-group metric values; means reduced over processes."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, float] = {}

    def add(self, values: dict[str, Tensor], keep: Tensor | None = None) -> None:
        """Add per-group values (each shape (B,)); ``keep`` (bool, (B,)) masks groups out."""
        for name, v in values.items():
            v = v.detach().float()
            ok = ~torch.isnan(v) if keep is None else ~torch.isnan(v) & keep
            self.sums[name] = self.sums.get(name, 0.0) + float(v[ok].sum())
            self.counts[name] = self.counts.get(name, 0.0) + float(ok.sum())

    def means(self, names: Sequence[str] | None = None) -> dict[str, float]:
        """Means over every process (a collective: all processes must call it, same names)."""
        names = sorted(self.sums) if names is None else list(names)
        flat = reduce_sums([x for n in names for x in (self.sums.get(n, 0.0),
                                                       self.counts.get(n, 0.0))])
        pairs = zip(flat[0::2], flat[1::2], strict=True)
        return {n: (s / c if c else math.nan) for n, (s, c) in zip(names, pairs, strict=True)}


def reduce_sums(values: Sequence[float]) -> list[float]:
    """Element-wise sums of ``values`` over all processes (a collective; a no-op alone)."""
    from accelerate.utils import reduce

    state = process_state()
    if state.num_processes == 1:
        return [float(v) for v in values]
    t = torch.tensor(list(values), dtype=torch.float64, device=state.device)
    return reduce(t, reduction="sum").tolist()


def _own_share(groups: Sequence[TokenizedGroup], batch_size: int) -> tuple[list[TokenizedGroup], int]:
    """This process's strided share of ``groups``, padded so every process runs the same
    number of batches (a sharded or DDP model needs every rank in every forward pass)."""
    state = process_state()
    own = list(groups[state.process_index::state.num_processes])
    per = math.ceil(len(groups) / state.num_processes)
    real = len(own)
    own += [groups[0]] * (per - real)  # padding, masked out of the metrics
    return own, real


@torch.no_grad()
def evaluate(model: Any, groups: Sequence[TokenizedGroup], *, beta: float,
             length_normalise: bool = False, batch_size: int = 8, pad_token_id: int = 0,
             share_prefix: bool = True, autocast_dtype: torch.dtype | None = None) -> dict[str, float]:
    """Preference metrics of ``model`` on ``groups`` (module docstring lists them).

    Reward metrics are computed when the groups carry ``ref_logps``; likelihood metrics always.
    Under ``accelerate``/``torchrun`` every process scores a share and the means are reduced.

    Args:
        model (Any): a causal LM (plain or wrapped by accelerate) on its device.
        groups (Sequence[TokenizedGroup]): the groups to score.
        beta (float): implicit reward scale.
        length_normalise (bool): divide log-ratios by the token count.
        batch_size (int): groups per forward pass.
        pad_token_id (int): padding id.
        share_prefix (bool): compute each prompt once per group.
        autocast_dtype (torch.dtype | None): autocast dtype of the forward passes.

    Returns:
        dict[str, float]: metric means and ``groups`` (how many were scored); empty when
        ``groups`` is empty.
    """
    if not groups:
        return {}
    with_ref = all(g.ref_logps is not None for g in groups)
    own, real = _own_share(groups, batch_size)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    sums = MetricSums()
    for start in range(0, len(own), batch_size):
        batch = collate_groups(own[start:start + batch_size], pad_token_id).to(device)
        keep = torch.arange(start, start + len(batch.group_ids), device=device) < real
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logps = group_logps(model, batch, share_prefix=share_prefix).float()  # (B, K)
        sums.add(likelihood_metrics(logps, batch), keep)
        if with_ref:
            sums.add(reward_metrics(logps, batch, beta, length_normalise), keep)
    model.train(was_training)
    names = ["logp_pair_accuracy", "logp_margin"]
    if with_ref:
        names += ["pair_accuracy", "margin", "reward_best", "reward_worst", "kl"]
    out = sums.means(names)
    out["groups"] = float(len(groups))
    return out


# -- comparing models, and the eval stage ---------------------------------------------------------
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
    delta = ({k: scores["model"][k] - v for k, v in scores["baseline"].items() if k != "groups"}
             if len(scores) == 2 else {})
    report = EvalReport(
        split=config.split, groups=len(tokenized), rejected=sum(r.scope == "row" for r in rejects),
        truncated_responses=sum(g.num_truncated for g in tokenized),
        model=model_label(config.model),
        baseline=model_label(config.baseline) if config.baseline else None,
        ref_model=model_label(ref_name) if ref_name else None,
        beta=_beta(config), length_normalise=bool(config.length_normalise),
        metrics=scores, delta=delta)
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


def run_eval(store: RunStore, config: EvalConfig, force: bool = False, *,
             allow_stale: bool = False) -> StageRun[ValidatedGroup]:
    """The ``eval`` stage: compare the trained model with its starting point on RUN/validate's
    held-out split; writes ``RUN/eval/metrics.json`` and the groups scored.

    Raises:
        StageError: RUN/validate is missing or stale (or RUN/train is, when it is read; both
            allowed with ``allow_stale``), or there is nothing to evaluate.
    """
    data = load_groups(store.root, stage=STAGE, allow_stale=allow_stale)
    resolved = resolve_from_train(config, store.manifest("train"))
    models = [m for m in (resolved.model, resolved.baseline, resolved.ref_model) if m]
    fp = sha256_text("|".join(model_fingerprint(m) for m in models))
    reads = ["validate", *(["train"] if store.is_complete("train") else [])]
    stale = data.stale + [c for c in (require_fresh(store, "train", allow_stale=allow_stale,
                                                    use="evaluate it")
                                      if "train" in reads else []) if c not in data.stale]
    if stale:  # an evaluation of stale input is another output: it joins the cache key
        fp = sha256_text(f"{fp}|stale:{','.join(stale)}")
    stage = store.open_stage(STAGE, resolved, input_fingerprint=fp, inputs=reads,
                             record_type=ValidatedGroup,
                             stage_version=STAGE_VERSION, force=force)
    if stage.cached:
        return stage
    found = compare_models(data.groups, resolved, cache_dir=stage.dir / "reference")
    shard = Shard(index=0, start=0, items=found.used)
    stage.write_shard(shard, found.used, found.rejects)
    (stage.dir / "metrics.json").write_text(found.report.model_dump_json(indent=2) + "\n")
    return stage.finish(inputs=found.inputs, stats=found.report.model_dump(mode="json"))
