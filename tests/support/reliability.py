"""A selected panel and an independent reliability reference, for the reliability tests."""

from __future__ import annotations

import itertools

import choix
import numpy as np
import torch

from grouppref.pipeline.simulate.config import AnnotatorSpec
from grouppref.pipeline.simulate.core import simulate_order
from grouppref.stats.reliability import (
    TARGETED,
    UNIFORM,
    UNMARKED,
)

ALPHA = 0.1


K = 4


def selected_panel(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """40 groups: three machines (0-2, flip 0.25) rank all; human 3 ranks 24 (16 targeted,
    8 uniform); human 4 ranks 10 without markers. ``ranks`` (B, 5, K), ``ann``, ``design``."""
    rng = np.random.default_rng(seed)
    b, a = 40, 5
    ranks = torch.full((b, a, K), -1, dtype=torch.long)
    ann = torch.full((b, a), -1, dtype=torch.long)
    design = torch.full((b, a), UNMARKED, dtype=torch.long)
    specs = [AnnotatorSpec(id=f"m{i}", flip_rate=0.25) for i in range(3)]
    specs += [AnnotatorSpec(id="h", flip_rate=0.1), AnnotatorSpec(id="h2", flip_rate=0.1)]
    for g in range(b):
        scores = rng.normal(size=K).tolist()
        who = [0, 1, 2] + ([3] if g < 24 else []) + ([4] if g >= 30 else [])
        for s, m in enumerate(who):
            order = simulate_order(scores, specs[m], rng)
            ranks[g, s, torch.tensor(order)] = torch.arange(K)
            ann[g, s] = m
            if m == 3:
                design[g, s] = TARGETED if g < 16 else UNIFORM
    return ranks, ann, design


def loo_counts_reference(ranks: np.ndarray, ann: np.ndarray, g: int, s: int) -> tuple[int, int]:
    """Pairs slot ``s`` of group ``g`` orders strictly the same / the other way as choix's fit
    of the group's other rankings (weights 1), over the pairs both order strictly."""
    data = []
    for o in range(ranks.shape[1]):
        if o != s and ann[g, o] >= 0:
            data += [(i, j) for i, j in itertools.permutations(range(K), 2)
                     if ranks[g, o, i] < ranks[g, o, j]]
    theta = choix.opt_pairwise(K, data, alpha=ALPHA, tol=1e-12)
    c = d = 0
    for i, j in itertools.combinations(range(K), 2):
        mine = np.sign(ranks[g, s, j] - ranks[g, s, i])  # +1: i before j
        cons = 0 if abs(theta[i] - theta[j]) < 1e-6 else np.sign(theta[i] - theta[j])
        if mine and cons:
            c, d = c + (mine == cons), d + (mine != cons)
    return c, d
