"""Where training data comes from, for ``grouppref train`` / ``grouppref eval``. ``DATA`` is one of

* a run directory: its ``RUN/validate`` output (``ValidatedGroup`` rows with their split),
  refused when stale (an upstream stage changed after validate ran) unless ``allow_stale``;
* anything ``grouppref export`` writes, and the same layouts from elsewhere
  (:mod:`grouppref.readers.published`): a ``save_to_disk`` folder, a Hub-layout folder
  (``README.md`` + ``data/*.parquet``), Parquet / JSON Lines files per split, one file, or a
  Hub dataset id; groups as they are, TRL pairs (string or chat prompts) as groups of K=2.
  A split named test/validation/eval is held out.

A row that is not a valid group becomes a reject with its split, row number and reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grouppref.readers.published import read_validated
from grouppref.runs.freshness import require_fresh
from grouppref.runs.hashing import canonical_json
from grouppref.runs.manifest import write_rejects
from grouppref.runs.store import RunStore, Shard, StageRun
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.train.engine.distributed import process_state
from grouppref.train.engine.model_folder import public_name, public_rejects

INPUT_STAGE = "validate"


@dataclass
class GroupSource:
    """Groups read from ``DATA``, the rows that could not be used, and the input fingerprint.

    ``format`` is ``run``, ``groups`` or ``trl-pairs``; ``stale`` the upstream stages that
    changed after RUN/validate ran (only with ``allow_stale``).
    """

    source: str
    groups: list[ValidatedGroup]
    rejects: list[Reject] = field(default_factory=list)
    rows: int = 0
    fingerprint: str = ""
    store: RunStore | None = None
    format: str = "run"
    stale: list[str] = field(default_factory=list)


def is_run(path: str | Path) -> bool:
    """True when ``path`` is a run directory (it holds at least one stage manifest)."""
    p = Path(path)
    return p.is_dir() and any(p.glob("*/manifest.json"))


def load_groups(source: str | Path, stage: str = "train", *,
                allow_stale: bool = False) -> GroupSource:
    """Read ``ValidatedGroup`` rows from a run or a published dataset (module docstring).

    Raises:
        InputFileError: ``source`` is none of these, or holds no rows.
        StageError: a run whose validate stage has not completed, or is stale (without
            ``allow_stale``).
    """
    text = str(source)
    if is_run(text):
        store = RunStore(text)
        manifest = store.require(INPUT_STAGE)
        stale = require_fresh(store, INPUT_STAGE, allow_stale=allow_stale,
                              use=f"{stage} on it")
        groups = (store.load_records(INPUT_STAGE, ValidatedGroup)
                  if manifest.counts.outputs else [])
        return GroupSource(source=text, groups=groups, rows=len(groups), store=store,
                           fingerprint=manifest.output_fingerprint or "", stale=stale)
    read = read_validated(text, stage)
    return GroupSource(source=text, groups=read.groups, rejects=read.rejects, rows=read.rows,
                       fingerprint=read.fingerprint, format=read.format)


def open_training_stage(store: RunStore, name: str, settings: dict[str, Any], key: str,
                        version: str, reuse: bool = True) -> StageRun[ValidatedGroup] | None:
    """Open a training stage of a run (``train``, ``train_rm``) that reads ``validate``.

    Under ``torchrun`` / ``accelerate launch`` every process calls this: each decides "cached
    or not" from the manifest alone, then all wait before the manifest changes, and only the
    main process opens (and later writes) the stage.

    Returns:
        StageRun | None: the cached stage (``.cached``) when ``reuse`` and one matches; else
        the opened stage on the main process, ``None`` on the others.
    """
    if reuse:
        hit = store.cached(name, settings, input_fingerprint=key, inputs=[INPUT_STAGE],
                           stage_version=version)
        if hit is not None:
            return StageRun(store, hit, ValidatedGroup, cached=True)
    state = process_state()
    state.wait_for_everyone()  # every process has decided before the manifest changes
    if not state.is_main_process:
        return None
    return store.open_stage(name, settings, input_fingerprint=key, inputs=[INPUT_STAGE],
                            record_type=ValidatedGroup, stage_version=version, force=True)


def training_stage_result(store: RunStore, name: str,
                          stage: StageRun[ValidatedGroup] | None) -> StageRun[ValidatedGroup]:
    """After training: wait for every process; the stage as the main process finished it."""
    process_state().wait_for_everyone()
    return stage or StageRun(store, store.require(name), ValidatedGroup, cached=False)


def record_training(stage: StageRun[ValidatedGroup], data: GroupSource, used: list[str],
                    rejects: list[Reject], stats: dict[str, Any], model_dir: Path) -> None:
    """Finish a training stage of a run (``train``, ``train_rm``): the groups it used (ids
    ``used``) are its records, with its rejects, its stats and the model folder as output."""
    keep = set(used)
    records = [g for g in data.groups if g.group_id in keep]
    stage.write_shard(Shard(index=0, start=0, items=records), records, rejects)
    stage.finish(inputs=data.rows, stats=stats, outputs={"model": str(model_dir)})


def publish_source(out: Path, data: GroupSource, rejects: list[Reject]) -> dict[str, int]:
    """A model trained on a dataset (not a run): ``rejects.jsonl`` (reading, tokenising and
    training rejects, with public file names only) and ``source.json`` go into its folder ``out``
    (main process only). Returns the ``inputs`` / ``rejected`` counts of the data."""
    if process_state().is_main_process:
        write_rejects(out / "rejects.jsonl", public_rejects(rejects, data.source))
        (out / "source.json").write_text(canonical_json(
            {"source": public_name(data.source), "format": data.format,
             "fingerprint": data.fingerprint}) + "\n")
    return {"inputs": data.rows, "rejected": sum(r.scope == "row" for r in rejects)}
