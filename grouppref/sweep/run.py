"""``grouppref sweep RUN|DATA``: the groups read like ``train`` reads them; in a run the sweep is
the ``sweep`` stage (``RUN/sweep``, shown by ``inspect``, cached on RUN/validate's output and
the settings), its study and files in the stage's folder unless ``out`` says otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grouppref.config import redact_credentials
from grouppref.errors import ConfigError
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas.sweep import SweepSummary
from grouppref.sweep.config import SweepConfig
from grouppref.sweep.engine import Progress, Sweep

STAGE = "sweep"
STAGE_VERSION = "1"


def stage_settings(config: SweepConfig, out_dir: Path) -> dict[str, Any]:
    """What the stage's cache key hashes: every setting (the storage's password removed) and
    the folder."""
    data = config.model_dump(mode="json")
    if data.get("storage"):
        data["storage"] = redact_credentials(data["storage"])
    return {"sweep": data, "out": str(out_dir)}


def _cached(store: RunStore, config: SweepConfig, out: Path) -> StageRun[Any] | None:
    hit = store.cached(STAGE, stage_settings(config, out), inputs=["validate"],
                       stage_version=STAGE_VERSION)
    return None if hit is None else StageRun(store, hit, None, cached=True)


def sweep_data(source: str | Path, config: SweepConfig, out_dir: str | Path | None = None, *,
               max_trials: int | None = None, allow_stale: bool = False, force: bool = False,
               progress: Progress = lambda _: None) -> SweepSummary:
    """Run (or resume) the sweep on ``source``; returns its summary. In a run, a complete
    ``sweep`` stage with the same settings and input is reused unless ``force``.

    Raises:
        ConfigError: ``source`` is not a run and no ``out_dir`` is given, or a bad setting.
        StageError / InputFileError: the data cannot be read.
    """
    from grouppref.train.data.sources import is_run, load_groups

    data = load_groups(source, stage=STAGE, allow_stale=allow_stale)
    run = is_run(source)
    if out_dir is None:
        if not run:
            raise ConfigError(f"{source} is not a run directory: pass --out DIR for the sweep")
        out_dir = RunStore(source).stage_dir(STAGE)
    out = Path(out_dir)
    sweep = Sweep(config, data.groups, data.fingerprint, out, progress)
    if not run:
        return sweep.run(max_trials)
    store = RunStore(source)
    if not force and (hit := _cached(store, config, out)) is not None:
        progress(f"sweep: unchanged settings and input, complete -> {hit.dir}")
        return SweepSummary.model_validate(hit.manifest.stats)
    stage: StageRun[Any] = store.open_stage(STAGE, stage_settings(config, out), record_type=None,
                                            inputs=["validate"], stage_version=STAGE_VERSION,
                                            force=True)  # the study itself resumes; the manifest is redone
    summary = sweep.run(max_trials)
    outputs = {"summary": str(out / "summary.json"), "plot": str(out / "sweep.png")}
    if (out / "best.yaml").exists():
        outputs["best"] = str(out / "best.yaml")
    done = sum(t.state in ("complete", "pruned", "failed") for t in summary.trials)
    if done >= summary.total:
        stage.finish(inputs=len(data.groups), kept=len(data.groups),
                     stats=summary.model_dump(mode="json"), outputs=outputs)
    return summary


def run_sweep_stage(store: RunStore, config: SweepConfig,
                    context: StageContext = StageContext()) -> StageRun[Any]:
    """The ``sweep`` step of ``grouppref run``: the sweep on RUN/validate into RUN/sweep
    (progress lines on stderr)."""
    import sys

    out = store.stage_dir(STAGE)
    sweep_data(store.root, config, out, allow_stale=context.allow_stale, force=context.force,
               progress=lambda line: print(line, file=sys.stderr, flush=True))
    return StageRun(store, store.require(STAGE), None, cached=False)
