"""Intervals over seeds and prompts: mean ± std, paired Student-t intervals, t quantiles."""

from __future__ import annotations

import math

import numpy as np


def mean_std(x: list[float]) -> dict[str, float]:
    a = np.asarray(x, dtype=float)
    return {"mean": float(a.mean()), "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
            "n": int(a.size)}


def paired_ci(a: list[float], b: list[float], level: float = 0.95) -> dict[str, float]:
    """Mean of the paired differences a − b with a Student-t confidence interval."""
    from scipy import stats

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    mean = float(d.mean())
    if d.size < 2:
        return {"mean": mean, "lo": math.nan, "hi": math.nan, "n": int(d.size)}
    half = float(stats.t.ppf(0.5 + level / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": int(d.size)}


# Student-t 0.975 quantiles by degrees of freedom (a 95% interval of a mean of up to 9 values)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def mean(xs: list[float]) -> float:
    """The mean of ``xs`` (nan when empty)."""
    return sum(xs) / len(xs) if xs else float("nan")


def half_width(xs: list[float], z: float) -> float:
    """``z`` times the standard error of ``xs`` (nan below 2 values)."""
    if len(xs) < 2:
        return float("nan")
    m = mean(xs)
    return z * math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))
