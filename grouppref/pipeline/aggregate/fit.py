"""The final per-group Bradley-Terry fit of the aggregate stage, batched, and its result."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import numpy as np
import torch

from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.runs.processes import MapFn
from grouppref.stats import bt, rankstats
from grouppref.stats.reliability import fit_batches


@dataclass
class BTFit:
    """Per-group fit results, tensors (or, after :meth:`numpy`, arrays) of B groups, A
    ranking slots and K candidates."""

    theta: Any  # (B, K) log-strengths
    p: Any  # (B, K, K) pair targets: the BT p_ij = P(i > j), or hard (see with_targets)
    w: Any  # (B, K, K) pair weights: the BT confidence w_ij, or hard
    wins: Any  # (B, K, K) weighted votes
    tiers: Any  # (B, K) consensus tier index, -1 for padding
    kendall_w: Any  # (B,) Kendall's W of the rankings used (NaN: not defined)
    cycle: Any  # (B,) bool: intransitive pairwise majority
    tau: Any  # (B, A) tau-b of each ranking against the consensus (NaN: not used)
    conc: Any  # (B, A) concordant pairs against the consensus
    disc: Any  # (B, A) discordant pairs against the consensus
    labels: Any = None  # (B, K) component of each candidate (numpy() only; -1: padding)

    def numpy(self) -> BTFit:
        """The fit as numpy arrays, with every group's comparison-graph components
        (:func:`~grouppref.stats.rankstats.component_labels`) computed at once."""
        arrays = {f.name: getattr(self, f.name).numpy() for f in fields(self) if f.name != "labels"}
        labels = rankstats.component_labels(self.wins, self.tiers >= 0).numpy()
        return BTFit(**arrays, labels=labels)


def fit_groups(ranks: torch.Tensor, slot_w: torch.Tensor, valid: torch.Tensor,
               config: AggregateConfig) -> BTFit:
    """The final per-group fit and statistics, in batches (no per-group Python loop).

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` tier indices, ``-1`` for padding.
        slot_w (torch.Tensor): ``(B, A)`` weight of each ranking (0: not used).
        valid (torch.Tensor): ``(B, K)`` bool, real (not padded) candidates.
        config (AggregateConfig): prior, batch size, tolerances.

    Returns:
        BTFit: the fitted tensors (see :class:`BTFit`).
    """
    alpha, bs = config.prior_strength, config.batch_size
    wins = torch.cat([bt.wins_rankings(ranks[s : s + bs], slot_w[s : s + bs])
                      for s in range(0, ranks.shape[0], bs)])
    theta = fit_batches(wins, alpha, bs, config.max_iter)
    cov = torch.cat([bt.covariance_pairwise(theta[s : s + bs], wins[s : s + bs], alpha)
                     for s in range(0, ranks.shape[0], bs)])
    tiers = rankstats.tiers_strengths(theta, valid, config.tie_tolerance)
    used = slot_w > 0
    conc, disc = rankstats.concordance(ranks, tiers[:, None, :])
    return BTFit(
        theta=theta, p=bt.probabilities_pairwise(theta), w=bt.confidence_pairwise(cov, alpha),
        wins=wins, tiers=tiers, kendall_w=rankstats.kendall_w(ranks, used),
        cycle=rankstats.majority_cycles(wins),
        tau=torch.where(used, rankstats.kendall_tau(ranks, tiers[:, None, :]), float("nan")),
        conc=torch.where(used, conc, 0), disc=torch.where(used, disc, 0))


# one batch of groups to fit: ranks (b, A, K), slot weights (b, A), valid (b, K), the
# settings and the pair targets; numpy arrays, so that another process can be handed it
FitBatch = tuple[np.ndarray, np.ndarray, np.ndarray, AggregateConfig, Literal["soft", "hard"]]


def fit_batch(batch: FitBatch) -> BTFit:
    """:func:`fit_groups` of one batch with ``targets`` (:func:`with_targets`), as numpy
    arrays (:meth:`BTFit.numpy`; a :class:`~grouppref.runs.processes.MapFn`'s task)."""
    ranks, slot_w, valid, config, targets = batch
    fit = fit_groups(torch.from_numpy(ranks), torch.from_numpy(slot_w), torch.from_numpy(valid),
                     config)
    return with_targets(fit, targets).numpy()


def fit_in_batches(ranks: torch.Tensor, slot_w: torch.Tensor, valid: torch.Tensor,
                   config: AggregateConfig, targets: Literal["soft", "hard"],
                   map_batches: MapFn = map) -> BTFit:
    """:func:`fit_groups` with ``targets``, as numpy arrays, made batch by batch
    (``config.batch_size`` groups) by ``map_batches`` (in other processes, say) and joined in
    batch order. The batches are the ones :func:`fit_groups` fits over every group (its
    Newton fits and covariances go batch by batch); only its per-group statistics after the
    fit are now made batch by batch too, element-wise the same numbers, so the result is
    the same (the stage's bytes: ``tests/integration/test_aggregate_stored.py``)."""
    bs = config.batch_size
    starts = range(0, ranks.shape[0], bs)
    if not starts:
        return with_targets(fit_groups(ranks, slot_w, valid, config), targets).numpy()

    def batch(s: int) -> FitBatch:
        return (ranks[s : s + bs].numpy(), slot_w[s : s + bs].numpy(), valid[s : s + bs].numpy(),
                config, targets)

    parts = list(map_batches(fit_batch, map(batch, starts)))
    return BTFit(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                    for f in fields(BTFit)})


def resolve_targets(config: AggregateConfig, noise: float | None) -> Literal["soft", "hard"]:
    """The pair targets to write: ``config.pair_targets``, with ``auto`` soft up to
    ``hard_targets_above`` estimated noise (and when there is no estimate), hard above it."""
    if config.pair_targets != "auto":
        return config.pair_targets
    return "hard" if noise is not None and noise > config.hard_targets_above else "soft"


def with_targets(fit: BTFit, targets: Literal["soft", "hard"]) -> BTFit:
    """``fit`` with hard consensus targets (:func:`rankstats.consensus_targets`) in place of
    the BT ``p``/``w`` when ``targets`` is ``hard``; unchanged for ``soft``."""
    if targets == "soft":
        return fit
    p, w = rankstats.consensus_targets(fit.tiers)
    return replace(fit, p=p, w=w)
