"""The job pool: experiment jobs in spawned processes of one torch thread each, each finished
job cached on disk so an interrupted run resumes."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from research.common.outputs import write_json


def _cached(arg: tuple[Any, Any, Path | None]) -> Any:
    fn, job, path = arg
    if path is not None and path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    out = fn(job)
    if path is not None:
        write_json(path, out)
    return out


def cache_path(cache: Path, job: dict[str, Any]) -> Path:
    """Where :func:`run_pool` keeps the result of ``job``: ``cache/<hash of the job>.json``."""
    import hashlib

    digest = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]
    return cache / f"{digest}.json"


def run_pool(fn: Any, jobs: list[dict[str, Any]], workers: int, cache: Path | None = None) -> list[Any]:
    """``fn`` over ``jobs`` in ``workers`` spawned processes of one torch thread each.

    With ``cache``, each job's result is kept as ``cache/<hash of the job>.json`` and reused,
    so an interrupted run resumes where it stopped.
    """
    args = [(fn, job, None if cache is None else cache_path(cache, job)) for job in jobs]
    if workers <= 1:  # in-process (tests): one thread, restored afterwards
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return [_cached(a) for a in args]
        finally:
            torch.set_num_threads(threads)
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(workers, initializer=torch.set_num_threads,
                                      initargs=(1,)) as pool:
        return pool.map(_cached, args, chunksize=1)




def job_cache(experiment: str, quick: bool) -> Path | None:
    """Where :func:`run_pool` keeps the finished jobs of a full run of ``experiment`` (under
    the system's temporary folder, so an interrupted run resumes); a quick run keeps none."""
    return None if quick else Path(tempfile.gettempdir()) / "grouppref-evidence" / experiment


def pooled_rows(fn: Any, jobs: list[dict[str, Any]], workers: int, cache: Path | None
                ) -> list[Any]:
    """:func:`run_pool` for jobs that each return a list of rows: all the rows, job by job."""
    return [row for part in run_pool(fn, jobs, workers, cache) for row in part]
