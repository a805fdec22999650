"""Constructed annotator panels as tensors: the input the reliability estimator reads
(``ranks`` (B, A, K), ``ann`` (B, A)), with the true flips each annotator made, so an estimate
can be compared with the truth (tests/integration/test_aggregate.py, research/ties).

:func:`tied_panel` draws groups whose true scores tie: K = 4 scores from ``levels`` values
(3 levels: about a third of the pairs tie, as with a coarse rule ranker; 0: normal scores, no
ties), three annotators at flip rate ``flip`` who must order tied candidates (at random, as
:func:`~grouppref.pipeline.simulate.core.simulate_order` does), and with ``declared`` a 4th,
rule-like ranking that gives the true tiers (equal scores share a tier) and so declares the ties.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from grouppref.pipeline.simulate.config import AnnotatorSpec
from grouppref.pipeline.simulate.core import order_flips, simulate_order

K = 4
ANNOTATORS = 3


@dataclass(frozen=True)
class TiedPanel:
    """``ranks`` (B, A, K) rank of each candidate (0 = best; the declared slot holds tiers),
    ``ann`` (B, A) annotator index per slot, per annotator the true ``flips`` and ``votes``
    (pairs with distinct true scores) (A,), and the true share of tied pairs ``tie_share``."""

    ranks: torch.Tensor
    ann: torch.Tensor
    flips: np.ndarray
    votes: np.ndarray
    tie_share: float


def tied_panel(groups: int, flip: float, levels: int, declared: bool, seed: int) -> TiedPanel:
    """A panel of ``groups`` groups (module docstring); the same ``seed`` gives the same panel."""
    rng = np.random.default_rng(seed)
    a = ANNOTATORS + int(declared)
    ranks = torch.empty(groups, a, K, dtype=torch.long)
    flips, votes, tied = np.zeros(a), np.zeros(a), 0
    spec = AnnotatorSpec(id="s", flip_rate=flip)
    for g in range(groups):
        drawn = rng.integers(0, levels, size=K) if levels else rng.normal(size=K)
        scores = drawn.astype(float).tolist()
        tied += sum(scores[i] == scores[j] for i in range(K) for j in range(i + 1, K))
        for m in range(ANNOTATORS):
            order = simulate_order(scores, spec, rng)
            f, n = order_flips(order, scores)
            flips[m], votes[m] = flips[m] + f, votes[m] + n
            ranks[g, m, torch.tensor(order)] = torch.arange(K)
        if declared:
            seen = sorted(set(scores), reverse=True)
            ranks[g, ANNOTATORS] = torch.tensor([seen.index(x) for x in scores])
            votes[ANNOTATORS] += sum(scores[i] != scores[j] for i in range(K) for j in range(i + 1, K))
    return TiedPanel(ranks=ranks, ann=torch.arange(a).expand(groups, a).clone(), flips=flips,
                     votes=votes, tie_share=tied / (groups * K * (K - 1) // 2))
