"""The reward-model trainer: ``AutoModelForSequenceClassification`` with one output on any causal
LM or encoder, trained on ranked groups with the group losses of :mod:`grouppref.train.objective.losses`
applied to the reward scores, on ``accelerate`` like ``train`` (DDP/FSDP/DeepSpeed through
``accelerate launch``; mixed precision; gradient accumulation).

Scores: ``s_i = r_θ(x, y_i)``, the head's logit on the sequence ``format_for_reward(x, y_i)``
(:mod:`grouppref.train.reward_model.encode`), pooled at its last non-pad token as transformers does for
every ``*ForSequenceClassification``. Loss per group (B groups, K candidates):

* ``gspo``: ``Σ_{i<j} w_ij·[−p_ij·log σ(s_i − s_j) − (1 − p_ij)·log σ(s_j − s_i)] / Σ_{i<j} w_ij``
  (:func:`~grouppref.train.objective.losses.gspo_loss` with the reward scores as ``s``, no reference);
* ``plackett_luce``: ``−Σ_k [s_τ(k) − logsumexp_{m≥k} s_τ(m)]`` over the consensus order τ;
* ``lipo``, ``nca``, ``infonca``: the listwise losses of :mod:`grouppref.train.objective.listwise` on the
  scores (LiPO-λ from the consensus tiers; NCA / InfoNCA with targets softmax(θ/α) of the
  aggregated strengths θ);
* plus ``center_rewards · mean_i s_i²`` when set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from grouppref.errors import ConfigError
from grouppref.models.loading import load_tokenizer, resolve_model
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.schemas.reports import RewardModelStats
from grouppref.train.engine.metric_sums import MetricSums
from grouppref.train.engine.prepare import add_lora, enable_checkpointing, require_trainable
from grouppref.train.eval.metrics import own_share, pair_margin
from grouppref.train.objective.dispatch import score_loss
from grouppref.train.objective.losses import pair_accuracy
from grouppref.train.reward_model.encode import encode_groups, split_held_out
from grouppref.train.settings.reward_model import RewardModelConfig
from grouppref.train.tensors.batch import GroupBatch, TokenizedGroup, collate_groups

DEFAULT_MAX_LENGTH = 1024
TRAIN_METRICS = ("loss", "pair_accuracy", "margin", "reward_mean", "reward_std")


@dataclass
class RewardModelResult:
    """What :func:`~grouppref.train.reward_model.trainer.train_reward_model` returns: its stats
    (``data_fingerprint`` left empty: the caller knows the data), the output folder, rejects and
    the ids of the groups used."""

    stats: RewardModelStats
    out_dir: Path
    rejects: list[Reject]
    used: list[str] = field(default_factory=list)  # group ids trained or held out


# -- model ------------------------------------------------------------------------------------
def load_reward_model(name: str | None, seed: int = 0) -> tuple[Any, Any]:
    """The base model with a 1-output sequence-classification head (seeded when new) and its
    tokenizer (right padding); ``config.pad_token_id`` is set, since transformers pools each
    row at its last token that is not the pad id.

    Raises:
        ModelNotFoundError: no such model. ConfigError: a classifier with more than one output.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    path = resolve_model(name)
    config = AutoConfig.from_pretrained(path)
    is_classifier = any(a.endswith("ForSequenceClassification") for a in config.architectures or [])
    if is_classifier and config.num_labels != 1:
        raise ConfigError(f"model {name!r} is a classifier with {config.num_labels} outputs; "
                          "train-rm puts a 1-output head on a base model: pass the base model "
                          "(or a reward model with num_labels=1)")
    tokenizer = load_tokenizer(path, padding_side="right")
    torch.manual_seed(seed)  # the new head's initialisation
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # not the load report of the new head: it is meant to be new
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    finally:
        hf_logging.set_verbosity(before)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def prepare_model(model: Any, config: RewardModelConfig) -> Any:
    """Gradient checkpointing, then LoRA adapters (``peft`` task ``SEQ_CLS``: the new score head
    is in ``modules_to_save``, so it trains fully while the base is frozen), then train mode."""
    if config.gradient_checkpointing:
        enable_checkpointing(model)
    if config.lora is not None:
        model = add_lora(model, config.lora, "SEQ_CLS", config.gradient_checkpointing)
    return model.train()


def context_length(model: Any, tokenizer: Any, given: int | None) -> int:
    """``given``, else the smaller of the model's positions and the tokenizer's limit."""
    if given is not None:
        return given
    limits = [getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length]
    usable = [x for x in limits if isinstance(x, int) and 0 < x < 1_000_000]
    return min(usable) if usable else DEFAULT_MAX_LENGTH


def reward_scores(model: Any, batch: GroupBatch) -> torch.Tensor:
    """Scores ``s`` (B, K) of every candidate sequence (0 in padding slots); one forward pass
    over the valid sequences, right-padded, with their attention mask."""
    b, k, t = batch.cand_ids.shape
    valid = batch.valid.reshape(-1)
    ids = batch.cand_ids.reshape(b * k, t)[valid]
    mask = batch.cand_mask.reshape(b * k, t)[valid]
    logits = model(input_ids=ids, attention_mask=mask).logits[:, 0].float()  # (V,)
    flat = torch.zeros(b * k, dtype=logits.dtype, device=logits.device)
    return flat.masked_scatter(valid, logits).view(b, k)


def reward_loss(s: torch.Tensor, batch: GroupBatch, config: RewardModelConfig) -> torch.Tensor:
    """Per-group loss (B,) of ``config.loss`` on scores ``s`` (module docstring), through the
    policy step's dispatch (:func:`grouppref.train.objective.dispatch.score_loss`)."""
    loss = score_loss(config.loss, s, batch, pair_targets=config.pair_targets,
                      target_temperature=config.target_temperature)
    if config.center_rewards > 0:
        valid = batch.valid.to(s.dtype)
        loss = loss + config.center_rewards * (s.pow(2) * valid).sum(1) / valid.sum(1)
    return loss


def batch_metrics(s: torch.Tensor, batch: GroupBatch) -> dict[str, torch.Tensor]:
    """Per-group pair accuracy against the consensus (weighted by w_ij, as in ``eval``), the
    reward margin of the decided pairs (winner minus loser, weighted by w_ij:
    :func:`~grouppref.train.eval.metrics.pair_margin`), and the mean and spread of the scores."""
    valid = batch.valid
    n = valid.sum(1).clamp(min=1)
    mean = (s * valid).sum(1) / n
    var = (((s - mean[:, None]) ** 2) * valid).sum(1) / n
    return {"pair_accuracy": pair_accuracy(s, batch.p_ij, batch.w_ij, valid),
            "margin": pair_margin(s, batch.p_ij, batch.w_ij, valid),
            "reward_mean": mean.detach(), "reward_std": var.sqrt().detach()}


def weighted_pairs(batch: GroupBatch) -> int:
    """Pairs i < j with ``w_ij > 0`` in ``batch``."""
    return int((batch.w_ij > 0).triu(diagonal=1).sum())


@torch.no_grad()
def evaluate_rm(model: Any, groups: Sequence[TokenizedGroup], config: RewardModelConfig,
                pad_token_id: int, autocast: torch.dtype | None = None) -> dict[str, float]:
    """Loss, pair accuracy and score spread of ``model`` on ``groups`` (means over groups).
    Under a launch every process scores its strided share, padded to the same number of
    batches (a sharded model needs every rank in every forward), and the sums are reduced."""
    if not groups:
        return {}
    own, real = own_share(groups, config.eval_batch_size)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    sums = MetricSums()
    for start in range(0, len(own), config.eval_batch_size):
        batch = collate_groups(own[start:start + config.eval_batch_size], pad_token_id).to(device)
        keep = torch.arange(start, start + len(batch.group_ids), device=device) < real
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            s = reward_scores(model, batch)
        sums.add({"loss": reward_loss(s, batch, config), **batch_metrics(s, batch)}, keep)
    model.train(was_training)
    out = sums.means(list(TRAIN_METRICS))
    out["groups"] = float(len(groups))
    return out


# -- setup ------------------------------------------------------------------------------------
def prepare_groups(groups: Sequence[ValidatedGroup], tokenizer: Any, max_length: int,
                   config: RewardModelConfig
                   ) -> tuple[list[TokenizedGroup], list[TokenizedGroup], list[Reject]]:
    """Split (held-out), encode; (train, held-out, rejects).

    Raises:
        StageError: no group is left to train on (the message names the reject reasons).
    """
    split = split_held_out(groups, config.held_out_fraction, config.seed, config.use_test_split)
    encoded, rejects = encode_groups(split, tokenizer, max_length)
    train_set = [g for g in encoded if g.split != "test"]
    held_out = [g for g in encoded if g.split == "test"]
    require_trainable(train_set, held_out, rejects, len(groups), "--max-length")
    return train_set, held_out, rejects
