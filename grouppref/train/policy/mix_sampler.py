"""The micro-batches of a training on a schedule of label sources (``--mix``; the schedule is
:class:`~grouppref.train.settings.mix.MixConfig`).

Sampling (pure, seeded, the same on every process): micro-batch ``g`` (counted over the
whole run and every process: the ``P x A`` micro-batches of update ``s`` are ``g = s*P*A ..
(s+1)*P*A - 1``) holds ``H(g+1) - H(g)`` human groups, ``H(g) = floor(b * C(g) + 1/2)``
where ``C(g)`` is the sum of the scheduled human share over the micro-batches before ``g``:
the realised share of any run of micro-batches is the scheduled one to within one group.
The rest of the batch is ``auto``. Each source is read from its own stream: passes over its
groups, each pass a fresh seeded permutation (``seed``, source, pass), so a small source
is revisited more often than a large one and no group repeats within a pass of its source.
An epoch is as many updates as hold the training set once (``ceil(N / (b*P*A))``);
accelerate gives process ``p`` micro-batches ``p, p + P, ...`` of it, as with the plain
sampler.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from grouppref.errors import ConfigError
from grouppref.train.settings.mix import SOURCES, MixConfig, Source

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from grouppref.train.settings.policy import TrainConfig
    from grouppref.train.tensors.batch import GroupBatch, TokenizedGroup


def check_sources(config: MixConfig, sources: Sequence[str]) -> None:
    """Fail before any model loads when a source the schedule draws from has no group.

    Raises:
        ConfigError: a source with share > 0 somewhere in the schedule and no training group.
    """
    for source in SOURCES:
        share = config.max_share(source)
        if share > 0 and source not in sources:
            kinds = ", ".join(config.human_kinds)
            fix = (f"add groups ranked by a human kind ({kinds}: grouppref label / simulate), "
                   "count more kinds as human (--mix-human-kinds)" if source == "human" else
                   "add automatically ranked groups (grouppref rank)")
            raise ConfigError(
                f"--mix gives {source} a share up to {share:g} ({config.describe()}), but none "
                f"of the {len(sources)} training groups is {source}-labelled; {fix}, or set "
                f"the {source} share to 0 at every point")


class MixSampler:
    """A batch sampler (torch ``DataLoader(batch_sampler=...)``) whose micro-batches follow a
    :class:`MixConfig` schedule; pure: batch ``g`` depends only on the arguments, ``g`` and
    ``seed`` (module docstring). ``len()`` is the micro-batches of one epoch over all
    processes, a multiple of ``processes * grad_accum``."""

    def __init__(self, config: MixConfig, sources: Sequence[str], *, batch_size: int,
                 total_steps: int, processes: int = 1, grad_accum: int = 1, seed: int = 0,
                 group_ids: Sequence[str] = ()):
        check_sources(config, sources)
        self.index = {gid: i for i, gid in enumerate(group_ids)}
        self.config, self.batch_size, self.seed = config, batch_size, seed
        self.total_steps, self.per_step = total_steps, processes * grad_accum
        self.members = {s: [i for i, x in enumerate(sources) if x == s] for s in SOURCES}
        self.sources = list(sources)
        self.steps_per_epoch = steps_per_epoch(len(sources), batch_size, processes, grad_accum)
        self.epoch = 0
        self._perms: dict[tuple[str, int], list[int]] = {}
        self._cum = [0.0]  # _cum[s]: scheduled human share summed over updates before s

    def __len__(self) -> int:
        return self.steps_per_epoch * self.per_step

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def target(self, step: int) -> dict[Source, float]:
        """Scheduled shares of the update made after ``step`` updates."""
        return self.config.shares_at(step, self.total_steps)

    def human_before(self, g: int) -> int:
        """``H(g)``: human groups in micro-batches ``0 .. g-1``."""
        step, within = divmod(g, self.per_step)
        while len(self._cum) <= step:
            s = len(self._cum) - 1
            self._cum.append(self._cum[-1] + self.per_step * self.target(s)["human"])
        total = self._cum[step] + within * self.target(step)["human"]
        return math.floor(self.batch_size * total + 0.5)

    def batch(self, g: int) -> list[int]:
        """Indices (into ``sources``) of micro-batch ``g``: human groups first."""
        h0, h1 = self.human_before(g), self.human_before(g + 1)
        a0, a1 = g * self.batch_size - h0, (g + 1) * self.batch_size - h1
        return ([self._stream("human", q) for q in range(h0, h1)]
                + [self._stream("auto", q) for q in range(a0, a1)])

    def _stream(self, source: Source, q: int) -> int:
        members = self.members[source]
        round_, pos = divmod(q, len(members))
        key = (source, round_)
        if key not in self._perms:
            perm = list(members)
            random.Random(f"{self.seed}:{source}:{round_}").shuffle(perm)
            self._perms = {k: v for k, v in self._perms.items()
                           if k[0] != source or k[1] >= round_ - 1}
            self._perms[key] = perm
        return self._perms[key][pos]

    def __iter__(self) -> Iterator[list[int]]:
        start = self.epoch * len(self)
        for g in range(start, start + len(self)):
            yield self.batch(g)

    def metrics(self, group_ids: Sequence[str], step: int) -> dict[str, list[float]]:
        """Per-group values of :data:`MIX_METRICS` for a batch (ids as given at construction):
        1/0 per source (their window mean is the realised share) and the scheduled shares of
        the update made after ``step`` updates."""
        sources = [self.sources[self.index[g]] for g in group_ids]
        target = self.target(step)
        out = {f"mix_{s}": [float(x == s) for x in sources] for s in SOURCES}
        return out | {f"mix_target_{s}": [target[s]] * len(sources) for s in SOURCES}


def steps_per_epoch(n: int, batch_size: int, processes: int, grad_accum: int) -> int:
    """Updates that hold ``n`` groups once: ``ceil(n / (b * P * A))``."""
    return max(1, math.ceil(n / (batch_size * processes * grad_accum)))


def mix_loader(config: TrainConfig, train_set: Sequence[TokenizedGroup],
               collate: Callable[[list[TokenizedGroup]], GroupBatch], processes: int
               ) -> tuple[DataLoader[TokenizedGroup], MixSampler]:
    """A ``DataLoader`` over ``train_set`` (tokenised groups with ``kinds``) whose batches
    follow ``config.mix`` (a :class:`TrainConfig`), and its sampler."""
    from torch.utils.data import DataLoader

    mix = config.mix
    assert mix is not None  # called only when config.mix is set
    sources = [mix.source_of(g.kinds) for g in train_set]
    per_epoch = steps_per_epoch(len(sources), config.batch_size, processes, config.grad_accum)
    sampler = MixSampler(mix, sources, batch_size=config.batch_size,
                         total_steps=config.max_steps or config.epochs * per_epoch,
                         processes=processes, grad_accum=config.grad_accum, seed=config.seed,
                         group_ids=[g.group_id for g in train_set])
    # torch's stubs want a Dataset; a sequence is a map-style dataset to the loader itself
    loader: DataLoader[TokenizedGroup] = DataLoader(
        train_set, batch_sampler=sampler, collate_fn=collate)  # type: ignore[arg-type]
    return loader, sampler
