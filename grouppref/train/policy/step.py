"""The training step and the plain loop: what every training in grouppref runs.

``step_loss`` is one forward pass of a group batch and its loss; the package trainer
(:mod:`grouppref.train.policy.trainer`) wraps it in accelerate (devices, gradient accumulation,
schedules, checkpoints), and :func:`run_steps` is the plain single-process loop over the same
step that experiments use (``research/``), so both train exactly the same objective.

Shapes: ``B`` groups, ``K`` candidates (see :mod:`grouppref.train.objective.losses`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from grouppref.train.objective.dispatch import policy_loss
from grouppref.train.objective.losses import implicit_rewards, importance_weights, sft_loss
from grouppref.train.settings.losses import LossName
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.tensors.batch import GroupBatch
from grouppref.train.tensors.logps import group_logps


@dataclass(frozen=True)
class Objective:
    """What a step minimises: the loss and its options (the loss fields of ``TrainConfig``)."""

    loss: LossName = "gspo"
    pair_targets: Literal["soft", "hard"] = "soft"
    beta: float = 0.1
    length_normalise: bool = False
    label_smoothing: float = 0.0
    robust: bool = False
    sft_weight: float = 0.0
    importance_clip: tuple[float, float] | None = None
    reference_free: bool = False
    target_margin: float = 0.0
    target_temperature: float = 1.0

    @classmethod
    def of(cls, config: TrainConfig) -> Objective:
        clip = tuple(config.importance_clip) if config.importance_clip is not None else None
        return cls(loss=config.loss, pair_targets=config.pair_targets, beta=config.beta,
                   length_normalise=config.length_normalise,
                   label_smoothing=config.label_smoothing, robust=config.robust,
                   sft_weight=config.sft_weight, importance_clip=clip,  # type: ignore[arg-type]
                   reference_free=config.reference_free, target_margin=config.target_margin,
                   target_temperature=config.target_temperature)


@dataclass
class StepOutput:
    """One step's per-group loss ``(B,)``, the policy log-probs ``(B, K)`` and diagnostics."""

    loss: torch.Tensor
    logps: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


def rewards(policy_logps: torch.Tensor, batch: GroupBatch, objective: Objective) -> torch.Tensor:
    """Implicit rewards ``s = beta * (log pi - log pi_ref)`` ``(B, K)`` (reference-free:
    ``beta * log pi``; per token with ``length_normalise``)."""
    return implicit_rewards(policy_logps, batch.ref_logps, objective.beta, batch.num_tokens,
                            objective.length_normalise, objective.reference_free)


def group_loss(policy_logps: torch.Tensor, batch: GroupBatch,
               objective: Objective) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-group training loss (B,) of the objective, plus per-group diagnostics.

    ``L = loss(s) + sft_weight · NLL(best)``, ``s = implicit_rewards(policy_logps, ref)``
    (:func:`grouppref.train.objective.dispatch.policy_loss` picks the loss); with ``importance_clip``
    each term is scaled by the clipped importance weights ρ. The ``sft`` loss is
    ``NLL(best)`` alone (no reference in the loss; ``s`` still feeds the metrics).
    """
    s = rewards(policy_logps, batch, objective)  # (B, K)
    rho = None
    if objective.importance_clip is not None:
        rho = importance_weights(policy_logps, batch.behavior_logps, batch.num_tokens,
                                 clip=objective.importance_clip)  # (B, K), detached
    loss = policy_loss(objective.loss, s, policy_logps, batch,
                       pair_targets=objective.pair_targets,
                       label_smoothing=objective.label_smoothing, robust=objective.robust,
                       target_margin=objective.target_margin,
                       target_temperature=objective.target_temperature, rho=rho)
    extra: dict[str, torch.Tensor] = {}
    if objective.sft_weight > 0:
        sft = sft_loss(policy_logps, batch.num_tokens, batch.order)  # (B,)
        loss = loss + objective.sft_weight * sft
        extra["sft_loss"] = sft.detach()
    if rho is not None:
        extra["rho"] = (rho * batch.valid).sum(1) / batch.valid.sum(1)
    return loss, extra


def step_loss(model: Any, batch: GroupBatch, objective: Objective,
              share_prefix: bool = True) -> StepOutput:
    """Forward one group batch through ``model`` and compute its per-group loss."""
    logps = group_logps(model, batch, share_prefix=share_prefix)  # (B, K)
    loss, extra = group_loss(logps, batch, objective)
    return StepOutput(loss=loss, logps=logps, extra=extra)


def run_steps(model: Any, optimizer: torch.optim.Optimizer, batches: Iterable[GroupBatch],
              objective: Objective, *, share_prefix: bool = True,
              max_grad_norm: float | None = None,
              after_step: Callable[[int, StepOutput, GroupBatch], None] | None = None) -> int:
    """The plain loop: for each batch, forward, backward, clip, optimiser step.

    One process, no gradient accumulation or schedule (the package trainer adds those through
    accelerate around the same :func:`step_loss`). ``after_step(step, output, batch)`` runs
    after every update (1-based step), e.g. to evaluate at chosen steps.

    Returns:
        int: the number of steps taken.
    """
    step = 0
    for batch in batches:
        out = step_loss(model, batch, objective, share_prefix)
        optimizer.zero_grad(set_to_none=True)
        out.loss.mean().backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        step += 1
        if after_step is not None:
            after_step(step, out, batch)
    return step
