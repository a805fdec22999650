"""Scoring a shard with every ranker at once: the served judges' requests on one event loop,
the in-process rankers meanwhile.

A rank stage may hold several served judges (``--ranker judge:openai:A@URL1 --ranker
judge:openai:B@URL2``, or a pairwise and a rubric judge on one server) next to in-process
rankers (rules, similarity, reward models, an in-process judge). :class:`ShardScorer` scores a
shard with all of them:

- **one** :class:`~grouppref.models.served.pool.ServerPool` for the stage, with one client per server
  URL. Judges on the same server share its limit: ``concurrency`` is the largest any of them
  sets, so the server never carries more requests in flight than when the judges ran one after
  another (``request_timeout`` and ``max_retries`` likewise the largest; they must name the
  same ``api_key_env``). Different servers keep their own limits, so two servers at
  concurrency ``c1`` and ``c2`` have ``c1 + c2`` requests in flight while there is work.
- every question of every served judge for the shard (pointwise K, pairwise K(K-1) both
  orders, rubric K per group) is a task on the pool's event loop, all sent at once.
- the in-process rankers run one after another in a worker thread (``asyncio.to_thread``)
  while those requests are in flight (torch releases the GIL in its kernels).

The outcomes are the same as scoring the rankers one after another: each ranker scores the
same groups, and each judge's answers are read in the order of its questions. The usage is
reported per (server, model) in the order of the rankers, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from grouppref.errors import ConfigError
from grouppref.models.served.pool import ServerPool, gather
from grouppref.models.served.settings import ServerSettings, server_label
from grouppref.pipeline.rank.outcomes import Outcome
from grouppref.pipeline.rank.rankers import Ranker
from grouppref.pipeline.rank.server_judge import ServerJudgeRanker
from grouppref.schemas import CandidateGroup
from grouppref.schemas.reports import ServerUsage


def shared_server_settings(servers: Sequence[ServerSettings]) -> dict[str, ServerSettings]:
    """The settings of one client per base URL for judges with ``servers`` settings (in order
    of first use): ``concurrency``, ``request_timeout`` and ``max_retries`` are the largest of
    the judges on that URL.

    Raises:
        ConfigError: judges on one URL name different ``api_key_env`` variables.
    """
    by_url: dict[str, list[ServerSettings]] = {}
    for s in servers:
        by_url.setdefault(s.base_url or "", []).append(s)
    out: dict[str, ServerSettings] = {}
    for url, group in by_url.items():
        keys = sorted({s.api_key_env or "(none)" for s in group})
        if len(keys) > 1:
            raise ConfigError(f"the served judges at {server_label(url)} name different "
                              f"api_key_env variables ({', '.join(keys)}); judges on one server "
                              "share one client: name the same variable")
        out[url] = group[0].model_copy(update={
            "concurrency": max(s.concurrency for s in group),
            "request_timeout": max(s.request_timeout for s in group),
            "max_retries": max(s.max_retries for s in group)})
    return out


class ShardScorer:
    """Scores shards with ``rankers`` (see the module docstring); use it as a context manager
    or call :meth:`close`.

    Raises:
        ConfigError: served judges on one server with different ``api_key_env``.
    """

    def __init__(self, rankers: Sequence[Ranker]) -> None:
        self.rankers = list(rankers)
        self.served = [r for r in self.rankers if isinstance(r, ServerJudgeRanker)]
        self.local = [r for r in self.rankers if not isinstance(r, ServerJudgeRanker)]
        self.servers = shared_server_settings([j.settings.server for j in self.served])
        self.pool: ServerPool | None = None
        self._usage: list[ServerUsage] = []
        self._loaded = False

    def __enter__(self) -> ShardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Open the shared pool and check every served judge's model (``GET /models``) in ranker
        order; nothing when there is no served judge."""
        if not self.served:
            return
        if self.pool is None:
            self.pool = ServerPool(self.servers)
            self.pool.__enter__()
            for judge in self.served:
                judge.attach(self.pool)
        for judge in self.served:
            judge.load()

    def connect(self, first: CandidateGroup | None = None) -> None:
        """:meth:`open`, and check each served judge's settings with one request (once per
        pool): its first question about ``first``, kept for the shard that asks it, or a short
        probe without ``first`` (a resumed stage); see
        :meth:`~grouppref.pipeline.rank.server_judge.ServerJudgeRanker.connect`."""
        self.open()
        for judge in self.served:
            judge.connect(first)

    def load(self) -> None:
        """:meth:`open`, and load the in-process rankers' models (once)."""
        self.open()
        if not self._loaded:
            for ranker in self.local:
                ranker.load()
            self._loaded = True

    def score(self, groups: Sequence[CandidateGroup]) -> list[list[Outcome]]:
        """Every ranker's outcomes for ``groups``: ``out[r][g]``, rankers in their order. The
        first call checks the served judges' settings with their first questions."""
        self.load()
        if self.pool is None:
            return [r.score(groups) for r in self.rankers]
        if groups:
            self.connect(groups[0])
        outcomes = self.pool.run(self._score_all(groups))
        by_ranker = dict(zip([id(r) for r in self.served + self.local], outcomes, strict=True))
        return [by_ranker[id(r)] for r in self.rankers]

    async def _score_all(self, groups: Sequence[CandidateGroup]) -> list[list[Outcome]]:
        """Served judges' outcomes (in order), then the in-process rankers' (in order)."""
        jobs = [judge.score_async(groups) for judge in self.served]
        if not self.local:
            return await gather(jobs)
        *served, local = await gather([*jobs, asyncio.to_thread(self._score_local, groups)])
        return [*served, *local]

    def _score_local(self, groups: Sequence[CandidateGroup]) -> list[list[Outcome]]:
        return [r.score(groups) for r in self.local]

    def usage(self) -> list[ServerUsage]:
        """Requests and tokens of the served judges so far (this session), per (server, model)
        in the order of the rankers."""
        now = self.pool.usage() if self.pool is not None else self._usage
        order = [(server_label(j.url), j.settings.model) for j in self.served]
        return sorted(now, key=lambda u: order.index((u.server, u.model))
                      if (u.server, u.model) in order else len(order))

    def close(self) -> None:
        """Close the shared pool (keeping its usage counts)."""
        if self.pool is None:
            return
        self._usage = self.pool.usage()
        for judge in self.served:
            judge.close()
        self.pool.__exit__(None, None, None)
        self.pool = None
