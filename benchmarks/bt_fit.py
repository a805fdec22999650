"""Batched Bradley-Terry fit (grouppref) vs a per-group ``choix.opt_pairwise`` loop.

Both fit the same MAP objective (BT log-likelihood + L2 prior ``alpha ||theta||^2``) on the
same synthetic groups: K candidates ranked by A simulated annotators (Mallows around random
true scores, flip rate 0.2, :mod:`grouppref.pipeline.simulate.stage`). Prints groups/s of both, the
ratio, and the largest difference of the (centred) strengths.

    .venv/bin/python benchmarks/bt_fit.py --groups 20000 --k 4 --annotators 3
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from importlib import metadata

import choix
import numpy as np
import torch

from grouppref.api import AnnotatorSpec, simulate_order
from grouppref.stats import bt


def make_rankings(groups: int, k: int, annotators: int, seed: int) -> np.ndarray:
    """(B, A, K) strict orders (candidate indices, best first) from a simulated panel."""
    rng = np.random.default_rng(seed)
    spec = AnnotatorSpec(id="sim", flip_rate=0.2)
    return np.array([[simulate_order(rng.normal(size=k).tolist(), spec, rng)
                      for _ in range(annotators)] for _ in range(groups)])


def fit_grouppref(orders: np.ndarray, alpha: float, threads: int) -> tuple[np.ndarray, float]:
    """Encode + batched fit of all groups; returns (theta (B, K), seconds)."""
    b, a, k = orders.shape
    start = time.perf_counter()
    with bt.torch_threads(threads):
        order_t = torch.from_numpy(orders)
        ranks = torch.empty_like(order_t).scatter_(-1, order_t, torch.arange(k).expand(b, a, k))
        wins = bt.wins_rankings(ranks, torch.ones(b, a, dtype=torch.float64))
        theta = bt.map_pairwise(wins, alpha, threads=None)
    return theta.numpy(), time.perf_counter() - start


def fit_choix(orders: np.ndarray, alpha: float, tol: float) -> tuple[np.ndarray, float]:
    """One ``choix.opt_pairwise`` call per group (pairs listed from each order)."""
    b, a, k = orders.shape
    out = np.empty((b, k))
    start = time.perf_counter()
    for g in range(b):
        data = [(int(o[i]), int(o[j])) for o in orders[g] for i in range(k)
                for j in range(i + 1, k)]
        theta = choix.opt_pairwise(k, data, alpha=alpha, tol=tol)
        out[g] = theta - theta.mean()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=20000)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--annotators", type=int, default=3)
    parser.add_argument("--alpha", type=float, default=0.1, help="L2 prior strength (both).")
    parser.add_argument("--choix-tol", type=float, default=1e-10,
                        help="choix Newton-CG xtol (tight, so both agree to 1e-6).")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for the batched fit (the library uses 1).")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    orders = make_rankings(args.groups, args.k, args.annotators, args.seed)
    fit_grouppref(orders[:64], args.alpha, args.threads)  # warm-up (first-call overheads)
    ours, t_ours = fit_grouppref(orders, args.alpha, args.threads)
    ref, t_ref = fit_choix(orders, args.alpha, args.choix_tol)
    diff = float(np.abs(ours - ref).max())
    print(f"groups={args.groups} K={args.k} annotators={args.annotators} alpha={args.alpha} "
          f"torch={torch.__version__} threads={args.threads} cpus={os.cpu_count()} "
          f"choix={metadata.version('choix')} "
          f"python={platform.python_version()}")
    print(f"grouppref batched: {args.groups / t_ours:12,.0f} groups/s ({t_ours:.3f} s)")
    print(f"choix loop:        {args.groups / t_ref:12,.0f} groups/s ({t_ref:.3f} s)")
    print(f"ratio: {t_ref / t_ours:.1f}x   max |theta - theta_choix| (centred): {diff:.2e}")


if __name__ == "__main__":
    main()
