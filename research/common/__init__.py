"""What the research experiments share, one module per concept:

* :mod:`research.common.testbed`: the synthetic testbed with a known true reward (a tiny LM
  over a synthetic vocabulary, the hidden reward, simulated annotator panels, aggregation and
  the training loop with the package's own step, all through :mod:`grouppref.api`);
* :mod:`research.common.intervals`: mean ± std, paired Student-t intervals, t quantiles;
* :mod:`research.common.pool`: jobs in spawned processes, each finished job cached on disk;
* :mod:`research.common.outputs`: the scripts' command line, results JSON, tables and log;
* :mod:`research.common.plots`: saving a figure;
* :mod:`research.common.screen`: the main of a screen script (pooled jobs, one JSON, a table).

The scripts read them as ``from research import common as c; c.make_task(...)``: each name
resolves on first use from its module (PEP 562), so a script that needs only the light ones
(intervals, outputs) does not load the testbed's transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module of research.common that defines it
MODULES: dict[str, str] = {
    **{name: "testbed" for name in (
        "Tensor", "METHODS", "LISTWISE", "Testbed", "Task", "tiny_lm", "true_reward",
        "interaction", "sample", "make_batch", "batched_logps", "make_task", "make_groups",
        "panel", "annotate", "aggregate", "posterior_targets", "method_data", "objective_of",
        "batch_of", "evaluate", "batch_indices", "train_method", "independent_ceiling",
        "realised_flip_rates")},
    **{name: "intervals" for name in ("mean_std", "paired_ci", "T975", "mean", "half_width")},
    **{name: "pool" for name in ("cache_path", "run_pool", "job_cache", "pooled_rows")},
    **{name: "outputs" for name in (
        "environment", "write_json", "run_or_replot", "log", "evidence_parser", "results_of")},
    "save_figure": "plots",
    "screen_main": "screen",
}

__all__ = sorted(MODULES)


def __getattr__(name: str) -> Any:
    module = MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'research.common' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"research.common.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
