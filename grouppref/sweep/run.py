"""``grouppref sweep RUN|DATA``: the groups read like ``train`` reads them; in a run the sweep is
the ``sweep`` stage (``RUN/sweep``, shown by ``inspect``, cached on RUN/validate's output and
the settings), its study and files in the stage's folder unless ``out`` says otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grouppref.config import redact_credentials
from grouppref.errors import ConfigError
from grouppref.runs.store import RunStore
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


def sweep_data(source: str | Path, config: SweepConfig, out_dir: str | Path | None = None, *,
               max_trials: int | None = None, allow_stale: bool = False,
               progress: Progress = lambda _: None) -> SweepSummary:
    """Run (or resume) the sweep on ``source``; returns its summary.

    Raises:
        ConfigError: ``source`` is not a run and no ``out_dir`` is given, or a bad setting.
        StageError / InputFileError: the data cannot be read.
    """
    from grouppref.train.sources import is_run, load_groups

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
    settings = stage_settings(config, out)
    stage = store.open_stage(STAGE, settings, record_type=None, inputs=["validate"],
                             stage_version=STAGE_VERSION,
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
