"""The main of a screen: pooled jobs of one experiment, their rows in one JSON and one table.

A screen script (``research/loss_screen/``) is its jobs, its job runner and its table; this is
the rest they shared: the command line (``--quick``, ``--out``, ``--workers``, ``--table`` to
print the table of the JSON alone), the job pool with its cache, and the results JSON with the
environment, wall time and load averages.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from research.common.outputs import environment, evidence_parser, log, results_of, write_json
from research.common.pool import job_cache, pooled_rows

Row = dict[str, Any]


def screen_main(argv: list[str] | None, *, doc: str | None, script: str, experiment: str,
                jobs: Callable[[bool], list[dict[str, Any]]], run_job: Callable[[dict[str, Any]], list[Row]],
                table: Callable[[dict[str, Any]], str], describe: Callable[[bool], dict[str, Any]],
                prior_rows: Callable[[Any], list[Row]] | None = None) -> dict[str, Any]:
    """Run ``jobs(quick)`` through ``run_job`` in the job pool (cached under ``experiment``)
    and write ``<out>/<experiment>[_quick].json`` and its ``_table.md`` (``table(result)``,
    also printed); with ``--table`` only print the table of that JSON. The result holds
    ``describe(quick)`` (settings, methods...) before the environment, and as ``runs`` the
    rows of ``prior_rows(args)`` (runs read from elsewhere) followed by the new ones.
    ``script`` is the caller's ``__file__`` (``--out`` defaults to its ``results/``)."""
    ap = evidence_parser(doc, results_of(script), workers=1)
    ap.add_argument("--table", action="store_true", help="only the table, from the JSON")
    args = ap.parse_args(argv)
    name = f"{experiment}_quick" if args.quick else experiment
    path = args.out / f"{name}.json"
    if args.table:
        result: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        print(table(result))
        return result
    todo = jobs(args.quick)
    load0, t0 = os.getloadavg(), time.perf_counter()
    rows = pooled_rows(run_job, todo, args.workers, job_cache(experiment, args.quick))
    before = prior_rows(args) if prior_rows is not None else []
    result = {"experiment": experiment, **describe(args.quick),
              "environment": environment(), "wall_s": time.perf_counter() - t0,
              "workers": args.workers, "load_average_start": load0,
              "load_average_end": os.getloadavg(), "runs": before + rows}
    write_json(path, result)
    (args.out / f"{name}_table.md").write_text(table(result) + "\n", encoding="utf-8")
    print(table(result))
    log(f"wrote {path} in {result['wall_s']:.0f} s")
    return result
