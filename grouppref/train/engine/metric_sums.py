"""Metric sums over the processes of a launch: per-group metric values summed (NaN-aware) and
their means reduced over every process, for the logging window, the held-out evaluation and the
refresh rounds."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from grouppref.train.engine.distributed import process_state

Tensor = torch.Tensor


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
