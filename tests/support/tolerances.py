"""Tolerances of the numeric comparisons, derived from what is compared (issue 31), so that a
test passes on any x86-64 CPU we get (Intel Xeon, AMD EPYC: different SIMD widths, so BLAS and
reductions sum in different orders) and still fails on a real difference.

The terms of a derivation:

- ``eps``: the dtype's machine epsilon (float32 1.19e-7, float64 2.2e-16): one rounding of a
  value ``x`` is off by at most ``eps/2 * |x|``.
- a sum of ``n`` terms of size ``m`` in another order differs by up to ``n * eps * m`` (worst
  case) and typically ``sqrt(n) * eps * m`` (:func:`sum_tol`). Both sides computed the same way
  on the same machine, with no reduction in a different order, are bit-identical: compare those
  exactly and say why.
- after ``steps`` optimiser steps (:func:`assert_trained_close`): Adam divides the first
  moment by the square root of the second, so a parameter moves by at most about ``lr`` a step
  whatever its gradient; a gradient that differs in its last bits (a different reduction order)
  moves a weight by ~``lr * (relative gradient difference)``, and by up to ``2 * lr`` where the
  gradient is near zero and its sign flips. The elementwise bound is therefore
  ``2 * steps * lr``, which two unrelated runs from one start also meet; what tells a real
  difference is the MEAN difference, which stays a small share of ``steps * lr``.
- transcendental functions (exp, log, tanh) may take another vectorised path on another CPU
  (AVX2 vs AVX-512 builds of SLEEF): up to ~1 ulp apart, so a result through them never gets an
  exact ``==`` across machines, only across two runs on one machine.

An exact ``==`` on a float stays where the value is exact by construction on any IEEE machine:
0 and 1, ratios of small counts with power-of-two denominators (1/2, 3/8), sums of such, config
values read back, a clamp to a bound, policy == reference (every margin exactly 0), and
bit-identical replays (a resumed run, DDP replicas: see each test's comment).
"""

from __future__ import annotations

import math

import torch

EPS32 = torch.finfo(torch.float32).eps  # 1.19e-7
EPS64 = torch.finfo(torch.float64).eps  # 2.2e-16

# A tiny model's float32 forward (tests/support/tiny_models.py: 2 layers, 32 wide, SmolLM2's
# 49,152-token vocabulary) computed two ways that sum in different orders (packed vs naive,
# compiled vs eager, another CPU's kernels). A log-prob is a log-softmax over V = 49,152 logits
# of size ~1-10: the log-sum-exp's relative error is ~sqrt(V) * eps = 2.6e-5 (typical), the
# 32-wide matmuls before it add ~sqrt(32) * eps * |x| each. 1e-4 absolute (with 1e-4 relative
# for values above 1) is 4x the typical error of the largest term and 1/100 of any change a bug
# makes (a wrong token or position moves a log-prob by > 1e-2).
MODEL_ATOL = 1e-4
MODEL_RTOL = 1e-4

# Gradients of that forward: the same sums run backwards, plus the sum over the batch's tokens
# (a few hundred): typical sqrt(n) * eps relative to the largest gradient, well under 1e-4.
GRAD_ATOL = 1e-4
GRAD_RTOL = 1e-4

# Adam moves a weight by <= lr a step; the mean over all weights of two runs that differ only in
# reduction order stays below this share of steps * lr (a real difference, e.g. another batch
# or a lost gradient, moves the mean difference to ~1/2 of steps * lr).
MEAN_SHARE = 1e-2


def sum_tol(n: int, magnitude: float, dtype: torch.dtype = torch.float32, worst: bool = True) -> float:
    """The absolute difference of a sum of ``n`` terms of size ``magnitude`` summed in two orders:
    ``n * eps * magnitude`` in the worst case, ``sqrt(n) * eps * magnitude`` typically."""
    eps = torch.finfo(dtype).eps
    return (n if worst else math.sqrt(n)) * eps * magnitude


def tol_after_steps(steps: int, lr: float) -> tuple[float, float]:
    """``(elementwise, mean)`` bounds on ``|a - b|`` for weights after ``steps`` Adam steps at
    ``lr`` that differ only in reduction order (see the module's docstring): elementwise
    ``2 * steps * lr`` (a sign flip each step), mean ``MEAN_SHARE * steps * lr``."""
    return 2 * steps * lr, MEAN_SHARE * steps * lr


def assert_trained_close(actual: torch.Tensor, expected: torch.Tensor, steps: int, lr: float) -> None:
    """Weights after ``steps`` Adam steps at ``lr`` on two sides that sum in different orders
    (compiled vs eager, DDP vs one process) agree: every element within Adam's bound and the
    mean within ``MEAN_SHARE`` of a step's reach (:func:`tol_after_steps`)."""
    elementwise, mean = tol_after_steps(steps, lr)
    torch.testing.assert_close(actual, expected, rtol=0, atol=elementwise)
    diff = (actual.double() - expected.double()).abs()
    assert diff.mean().item() <= mean, (
        f"mean |diff| {diff.mean().item():.3g} > {mean:.3g} (max {diff.max().item():.3g}; "
        f"{steps} steps at lr {lr})")


def tol_after_sgd_steps(steps: int, lr: float, terms: int, magnitude: float = 1.0) -> float:
    """Elementwise bound on ``|a - b|`` for weights after ``steps`` plain SGD steps at ``lr`` whose
    gradients are sums of ``terms`` contributions of size ``magnitude`` summed in two orders
    (FSDP's reduce-scatter of 2 shards vs one process): SGD moves a weight by ``lr * g``, so a
    gradient off by :func:`sum_tol` (worst case) moves it by ``lr`` times that, each step."""
    return steps * lr * sum_tol(terms, magnitude)
