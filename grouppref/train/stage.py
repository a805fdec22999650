"""Where training data comes from (a run, a saved dataset, a Hub id) and the ``train`` stage.

``DATA`` for ``grouppref train`` / ``grouppref eval`` is one of

* a run directory: its ``RUN/validate`` output (``ValidatedGroup`` rows with their split);
  training then records a manifest in ``RUN/train`` (cached like every stage) and saves the
  model in ``RUN/train/model`` unless ``--out`` says otherwise;
* a dataset saved with ``save_to_disk`` whose rows are ``ValidatedGroup`` records (a
  ``DatasetDict`` contributes every split; a split named test/validation/eval is held out);
* a Hub dataset id of the same shape.

A row that is not a valid ``ValidatedGroup`` becomes a reject with its row number and reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grouppref.errors import ConfigError, InputFileError
from grouppref.readers.rows import HUB_ID
from grouppref.runs.store import (
    RunStore,
    Shard,
    canonical_json,
    config_hash,
    fingerprint_file,
    read_rejects,
    sha256_text,
    write_rejects,
)
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.schemas.arrow import from_row
from grouppref.train.config import TrainConfig, process_state
from grouppref.train.trainer import train

STAGE = "train"
STAGE_VERSION = "1"
_HELD_OUT_SPLITS = {"test", "validation", "eval"}


@dataclass
class GroupSource:
    """Groups read from ``DATA``, the rows that could not be used, and the input fingerprint."""

    source: str
    groups: list[ValidatedGroup]
    rejects: list[Reject] = field(default_factory=list)
    rows: int = 0
    fingerprint: str = ""
    store: RunStore | None = None


def is_run(path: str | Path) -> bool:
    """True when ``path`` is a run directory (it holds at least one stage manifest)."""
    p = Path(path)
    return p.is_dir() and any(p.glob("*/manifest.json"))


def _load_dataset(source: str) -> Any:
    import datasets

    try:
        if Path(source).is_dir():
            return datasets.load_from_disk(source)
        return datasets.load_dataset(source)
    except (FileNotFoundError, ValueError, OSError, ConnectionError) as e:
        raise InputFileError(f"{source}: cannot load as a saved dataset or Hub dataset ({e})") from e


def _row_to_group(row: dict[str, Any], split_name: str | None, source: str, number: int,
                  stage: str) -> ValidatedGroup | Reject:
    if split_name is not None and row.get("split") is None:
        row = {**row, "split": "test" if split_name in _HELD_OUT_SPLITS else "train"}
    try:
        return from_row(ValidatedGroup, row)
    except ValidationError as e:
        first = e.errors()[0]
        reason, loc = first["msg"], ".".join(str(x) for x in first["loc"]) or None
    except (ValueError, TypeError) as e:  # e.g. a JSON column that does not parse
        reason, loc = str(e), None
    gid = row.get("group_id")
    return Reject(stage=stage, reason=f"not a ValidatedGroup row: {reason}", source=source,
                  row=number, group_id=gid if isinstance(gid, str) else None, field=loc)


def load_groups(source: str | Path, stage: str = STAGE) -> GroupSource:
    """Read ``ValidatedGroup`` rows from a run, a saved dataset or a Hub id.

    Raises:
        InputFileError: ``source`` is none of these, or holds no rows.
        StageError: a run whose validate stage has not completed.
    """
    text = str(source)
    if is_run(text):
        store = RunStore(text)
        manifest = store.require("validate")
        groups = store.load_records("validate", ValidatedGroup)
        return GroupSource(source=text, groups=groups, rows=len(groups), store=store,
                           fingerprint=manifest.output_fingerprint or "")
    if not Path(text).exists() and not HUB_ID.match(text):
        raise InputFileError(f"{text}: not a run directory, a saved dataset or a Hub dataset id")
    import datasets

    loaded = _load_dataset(text)
    parts = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [(None, loaded)]
    out = GroupSource(source=text, groups=[])
    for split_name, ds in parts:
        for row in ds:
            out.rows += 1
            got = _row_to_group(row, split_name, text, out.rows, stage)
            (out.rejects if isinstance(got, Reject) else out.groups).append(got)  # type: ignore[arg-type]
    if out.rows == 0:
        raise InputFileError(f"{text}: no rows")
    path = Path(text)
    out.fingerprint = fingerprint_file(path) if path.exists() else sha256_text(f"hub:{text}")
    return out


@dataclass
class TrainOutcome:
    """What :func:`run_train` did: metrics, where the model is, counts and rejects."""

    metrics: dict[str, Any]
    out_dir: Path
    cached: bool
    counts: dict[str, int]
    rejects: list[Reject]
    stage_dir: Path | None = None


def _stage_config(config: TrainConfig, out_dir: Path) -> dict[str, Any]:
    return {"train": config.model_dump(mode="json"), "out": str(out_dir)}


def _cached(store: RunStore, stage_config: dict[str, Any], fingerprint: str) -> bool:
    m = store.manifest(STAGE)
    return (m is not None and m.status == "complete"
            and m.config_hash == config_hash(stage_config, STAGE_VERSION)
            and m.input_fingerprint == fingerprint and Path(m.stats.get("output_dir", "")).is_dir())


def run_train(source: str | Path, config: TrainConfig, out_dir: str | Path | None = None, *,
              resume: bool | str | Path = False, force: bool = False,
              reference_cache: Path | None = None) -> TrainOutcome:
    """Train on ``source`` (see the module docstring); in a run, record ``RUN/train``.

    Args:
        source (str | Path): run directory, saved dataset directory or Hub dataset id.
        config (TrainConfig): the settings.
        out_dir (str | Path | None): where the model goes (default in a run:
            ``RUN/train/model``; required otherwise).
        resume (bool | str | Path): continue from the latest (True) or a given checkpoint.
        force (bool): in a run, train again even when RUN/train is cached.
        reference_cache (Path | None): reference log-prob cache folder (default: in a run
            ``RUN/train/reference``, else ``OUT/reference``).

    Raises:
        ConfigError: no ``out_dir`` for a source that is not a run.
    """
    data = load_groups(source)
    store = data.store
    if out_dir is None:
        if store is None:
            raise ConfigError(f"{source} is not a run directory: pass --out DIR for the model")
        out_dir = store.stage_dir(STAGE) / "model"
    out_dir = Path(out_dir)
    if store is None:
        return _train_plain(data, config, out_dir, resume, reference_cache)
    stage_config = _stage_config(config, out_dir)
    if not force and not resume and _cached(store, stage_config, data.fingerprint):
        return _cached_outcome(store, out_dir)
    state = process_state()
    state.wait_for_everyone()  # every process has decided before the manifest changes
    stage = None
    if state.is_main_process:
        stage = store.open_stage(STAGE, stage_config, input_fingerprint=data.fingerprint,
                                 record_type=ValidatedGroup, stage_version=STAGE_VERSION,
                                 force=True)
    result = train(config, data.groups, out_dir, resume=resume,
                   reference_cache=reference_cache or store.stage_dir(STAGE) / "reference")
    counts = {"inputs": data.rows, "outputs": len(result.used),
              "rejected": sum(r.scope == "row" for r in result.rejects)}
    if stage is not None:
        used = set(result.used)
        records = [g for g in data.groups if g.group_id in used]
        stage.write_shard(Shard(index=0, start=0, items=records), records, result.rejects)
        stage.finish(inputs=data.rows, stats={**result.metrics, "output_dir": str(out_dir)})
    state.wait_for_everyone()
    return TrainOutcome(metrics=result.metrics, out_dir=out_dir, cached=False, counts=counts,
                        rejects=result.rejects, stage_dir=store.stage_dir(STAGE))


def _cached_outcome(store: RunStore, out_dir: Path) -> TrainOutcome:
    m = store.require(STAGE)
    stage_dir = store.stage_dir(STAGE)
    return TrainOutcome(metrics=m.stats, out_dir=out_dir, cached=True,
                        counts=m.counts.model_dump(), rejects=read_rejects(stage_dir / "rejects.jsonl"),
                        stage_dir=stage_dir)


def _train_plain(data: GroupSource, config: TrainConfig, out_dir: Path,
                 resume: bool | str | Path, reference_cache: Path | None) -> TrainOutcome:
    """Train on a dataset / Hub source: rejects (reading + tokenizing) go to OUT/rejects.jsonl."""
    result = train(config, data.groups, out_dir, resume=resume, reference_cache=reference_cache)
    rejects = data.rejects + result.rejects
    if process_state().is_main_process:
        write_rejects(out_dir / "rejects.jsonl", rejects)
        (out_dir / "source.json").write_text(canonical_json(
            {"source": data.source, "fingerprint": data.fingerprint}) + "\n")
    counts = {"inputs": data.rows, "outputs": len(result.used),
              "rejected": sum(r.scope == "row" for r in rejects)}
    return TrainOutcome(metrics=result.metrics, out_dir=out_dir, cached=False, counts=counts,
                        rejects=rejects)
