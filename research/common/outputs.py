"""What every experiment script writes and how it is called: its command line (``--quick``,
``--out`` = its own ``results/`` folder), the results JSON with the environment, the per-seed
run-or-replot block and the log line."""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def environment() -> dict[str, Any]:
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "machine": platform.machine(),
            "processor": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def run_or_replot(args: Any, run_seed: Callable[[Any, int], list[dict[str, Any]]],
                  render: Callable[[list[dict[str, Any]]], str]) -> list[dict[str, Any]]:
    """The main block of a per-seed simulation: rows from ``args.out/<args.name>.json`` with
    ``args.replot``, else ``run_seed(args, seed)`` over ``args.seeds``, written there with the
    settings, seconds and environment; ``render(rows)`` goes to ``<name>_table.md`` and stdout.

    ``args`` needs ``out``, ``name``, ``seeds`` and ``replot``; torch runs on one thread."""
    torch.set_num_threads(1)
    start = time.time()
    path = args.out / f"{args.name}.json"
    if args.replot:
        rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    else:
        rows = [r for seed in args.seeds for r in run_seed(args, seed)]
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        write_json(path, {"settings": settings, "seconds": round(time.time() - start, 1),
                          "environment": environment(), "rows": rows})
    text = render(rows)
    (args.out / f"{args.name}_table.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    print(f"{time.time() - start:.0f} s")
    return rows


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def evidence_parser(doc: str | None, results: Path, outputs: str = "JSON, tables, plots",
                    workers: int | None = None, threads: int | None = None
                    ) -> argparse.ArgumentParser:
    """The options every experiment script takes: ``--quick`` and ``--out`` (a folder for
    ``outputs``, default ``results``: the experiment's own ``results/`` folder, see
    :func:`results_of`); with ``workers``, ``--workers`` (processes of one
    torch thread each, that many by default); with ``threads``, ``--threads`` (torch threads
    of the one process). The description is the first line of ``doc``."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test")
    ap.add_argument("--out", type=Path, default=results, help=f"folder for {outputs}")
    if workers is not None:
        ap.add_argument("--workers", type=int, default=workers,
                        help="processes (one torch thread each)")
    if threads is not None:
        ap.add_argument("--threads", type=int, default=threads, help="torch threads")
    return ap


def results_of(script: str) -> Path:
    """The ``results/`` folder of the experiment that ``script`` (a ``__file__``) belongs to:
    research/<experiment>/results/, where its README links its numbers."""
    return Path(script).resolve().parent / "results"
