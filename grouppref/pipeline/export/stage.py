"""The ``export`` stage: validated groups to a directory, a Parquet file or the Hugging Face Hub.

Reads only ``RUN/validate``, and refuses it when it is stale (an upstream stage changed after it
ran) unless ``allow_stale`` (the card then says so). Two formats:

- ``groups``: the ``ValidatedGroup`` rows as they are (one row per group), splits train/test.
- ``trl-pairs``: TRL's preference format, one row per *consensus pair*: a pair preference
  whose winner sits in a strictly better consensus tier than its loser (pairs tied in the
  consensus, or ordered against it, are skipped and counted). Columns ``prompt``, ``chosen``,
  ``rejected`` (chat turns when the prompt is chat, else strings; see ``chat``), plus ``p``,
  ``weight``, ``group_id``, ``chosen_id``, ``rejected_id``. ``pairs="best_worst"`` keeps one pair
  per group (top tier vs bottom tier, highest ``p``): DPO's classic data.

``split`` exports one split only. Everything written here reads back with
:mod:`grouppref.readers.published` (``train``, ``eval``, ``validate --source``).

Targets: ``to_dir`` (``DatasetDict.save_to_disk`` + ``README.md``), ``parquet`` (one file per
split, ``DIR/train.parquet``, ``DIR/test.parquet`` + ``README.md`` whose ``configs`` name them; or
one split into ``FILE.parquet`` + ``FILE.md``), ``hub`` (``DatasetDict.push_to_hub`` then
the card uploaded as ``README.md``); ``dry_run`` writes the files a hub push would create
(``data/<split>-<i>-of-<n>.parquet`` + ``README.md``) into a folder instead.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import pyarrow.compute as pc
from pydantic import ValidationError

from grouppref.errors import ConfigError, StageError
from grouppref.pipeline.export.card import dataset_card
from grouppref.pipeline.export.config import INPUT_STAGE, SPLITS, STAGE_VERSION, ExportConfig
from grouppref.pipeline.export.formats import build_dataset, groups_from_table, pairs_from_table
from grouppref.runs.freshness import require_fresh
from grouppref.runs.hashing import canonical_json, sha256_text
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.schemas.arrow import stored_as
from grouppref.schemas.reports import ExportReport

try:  # the HTTP client of huggingface_hub 2.x; its errors are not all OSErrors
    from httpx2 import HTTPError as _HTTPError

    _NETWORK_ERRORS: tuple[type[Exception], ...] = (OSError, _HTTPError)
except ImportError:  # older huggingface_hub: requests' errors are OSErrors
    _NETWORK_ERRORS = (OSError,)
if TYPE_CHECKING:
    import pyarrow as pa


# -- input --------------------------------------------------------------------------------------
def load_validated(store: RunStore) -> list[ValidatedGroup]:
    """Every group of ``RUN/validate`` as a validated record (a validate output not in the
    stage's own schema; the stage's own table is read as Arrow).

    Raises:
        StageError: a row is not a valid group, or has no split.
    """
    if store.require(INPUT_STAGE).counts.outputs == 0:  # nothing passed (a run of an older
        return []                                       # version saved no file for it)
    try:
        groups = store.load_records(INPUT_STAGE, ValidatedGroup)
    except ValidationError as e:
        raise StageError(f"{store.stage_dir(INPUT_STAGE)} holds an invalid row ({e.errors()[0]}); "
                         f"run `grouppref validate {store.root} --force`") from e
    unsplit = [g.group_id for g in groups if g.split is None]
    if unsplit:
        raise StageError(f"{len(unsplit)} validated groups have no split (first {unsplit[0]}); "
                         f"run `grouppref validate {store.root} --force`")
    return groups


def stored_table(store: RunStore) -> pa.Table | None:
    """``RUN/validate``'s Arrow table when it is the stage's own output in the
    ``ValidatedGroup`` schema (rows validated as records when they were written), else None
    (empty, or another schema: those go through :func:`load_validated`)."""
    if store.require(INPUT_STAGE).counts.outputs == 0:
        return None
    table = store.load_table(INPUT_STAGE)
    return table if stored_as(table.schema, ValidatedGroup) else None


# -- targets ------------------------------------------------------------------------------------
def num_shards(dsd: datasets.DatasetDict, max_shard_size: str) -> dict[str, int]:
    """Parquet shards per split for the Hub (the same number for the push and the dry run)."""
    from datasets.utils.py_utils import convert_file_size_to_int

    try:
        limit = convert_file_size_to_int(max_shard_size)
    except ValueError as e:
        raise ConfigError(f"max_shard_size {max_shard_size!r} is not a size like 500MB") from e
    return {s: max(1, min(len(ds), int(ds.data.nbytes / limit) + 1)) for s, ds in dsd.items()}


def _save_dir(dsd: datasets.DatasetDict, card: str, target: Path) -> list[str]:
    if target.exists() and any(target.iterdir()) and not (target / "dataset_dict.json").exists():
        raise ConfigError(f"--to {target}: the directory exists and is not a dataset export; "
                          "choose an empty or new directory")
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    dsd.save_to_disk(str(tmp))
    (tmp / "README.md").write_text(card, encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())


def _save_parquet(dsd: datasets.DatasetDict, card: str, target: Path) -> list[str]:
    """One Parquet file per split: ``DIR/<split>.parquet`` + ``DIR/README.md``, or, for a name
    ending in .parquet, that file (one split: the config asks for ``--split``) + ``FILE.md``."""
    if target.suffix == ".parquet":
        target.parent.mkdir(parents=True, exist_ok=True)
        (ds,) = dsd.values()
        tmp = target.with_name(target.name + ".tmp")
        ds.to_parquet(str(tmp))
        os.replace(tmp, target)
        target.with_suffix(".md").write_text(card, encoding="utf-8")
        return [target.name, target.with_suffix(".md").name]
    ours = {"README.md", *(f"{s}.parquet" for s in SPLITS)}
    if target.exists() and {p.name for p in target.iterdir()} - ours:
        raise ConfigError(f"--parquet {target}: the folder holds other files than a Parquet "
                          "export; choose an empty or new folder (or a name ending in .parquet)")
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for split, ds in dsd.items():
        ds.to_parquet(str(tmp / f"{split}.parquet"))
    (tmp / "README.md").write_text(card, encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return [*(f"{s}.parquet" for s in dsd), "README.md"]


def _save_dry_run(dsd: datasets.DatasetDict, card: str, target: Path, shards: dict[str, int]
                  ) -> list[str]:
    """The files ``push_to_hub`` + the card upload would create, under the same names."""
    from datasets.arrow_writer import (
        get_writer_batch_size_from_data_size,
        get_writer_batch_size_from_features,
    )

    shutil.rmtree(target, ignore_errors=True)
    (target / "data").mkdir(parents=True)
    files = []
    for split, ds in dsd.items():
        batch = get_writer_batch_size_from_features(ds.features) or \
            get_writer_batch_size_from_data_size(len(ds), ds.data.nbytes)
        n = shards[split]
        for index in range(n):
            name = f"data/{split}-{index:05d}-of-{n:05d}.parquet"
            ds.shard(num_shards=n, index=index, contiguous=True).to_parquet(
                str(target / name), batch_size=batch)
            files.append(name)
    (target / "README.md").write_text(card, encoding="utf-8")
    return [*files, "README.md"]


def _push(dsd: datasets.DatasetDict, card: str, repo: str, config: ExportConfig,
          shards: dict[str, int]) -> list[str]:
    """The real Hub path: ``DatasetDict.push_to_hub`` then ``README.md`` via ``HfApi``."""
    from huggingface_hub import HfApi, get_token

    token = get_token()  # HF_TOKEN, else the token saved by `hf auth login`; never printed
    if not token:
        raise ConfigError("no Hugging Face token: set HF_TOKEN (or run `hf auth login`) to push "
                          f"to {repo}, or add --dry-run to write the files locally")
    try:
        dsd.push_to_hub(repo, private=config.private, token=token, num_shards=shards,
                        commit_message="grouppref export: data")
        HfApi(token=token).upload_file(
            path_or_fileobj=card.encode("utf-8"), path_in_repo="README.md", repo_id=repo,
            repo_type="dataset", commit_message="grouppref export: dataset card")
    except _NETWORK_ERRORS as e:  # the messages name the URL, never the token
        raise StageError(f"push to the Hub dataset {repo!r} failed: {e}; check the repo name, "
                         "that the token may write to it, and the network (or use --dry-run)"
                         ) from e
    return [f"data/{s}-{i:05d}-of-{n:05d}.parquet" for s, n in shards.items()
            for i in range(n)] + ["README.md"]


def data_files(config: ExportConfig, dsd: datasets.DatasetDict) -> dict[str, str] | None:
    """The card's ``configs`` entry, split -> files, where the card is a repo's README.md next
    to Parquet files (so ``load_dataset`` and the Hub find every split); else None."""
    if config.hub:
        return {s: f"data/{s}-*" for s in dsd}
    if config.parquet and not config.parquet.endswith(".parquet"):
        return {s: f"{s}.parquet" for s in dsd}
    return None


def _write_target(store: RunStore, dsd: datasets.DatasetDict, card: str,
                  config: ExportConfig) -> tuple[str, list[str]]:
    if config.to_dir:
        return config.to_dir, _save_dir(dsd, card, Path(config.to_dir))
    if config.parquet:
        return config.parquet, _save_parquet(dsd, card, Path(config.parquet))
    shards = num_shards(dsd, config.max_shard_size)
    if config.dry_run:
        where = Path(config.dry_run_dir or store.stage_dir(config.stage_name()) / "dry-run")
        return str(where), _save_dry_run(dsd, card, where, shards)
    return f"hub:{config.hub}", _push(dsd, card, config.hub or "", config, shards)


def run_export(store: RunStore, config: ExportConfig,
               context: StageContext = StageContext()) -> StageRun[Any]:
    """Export ``RUN/validate`` in ``config.format`` to ``config``'s target, recorded in
    ``RUN/export/<target>/`` (its own manifest, rejects and cache entry per target).

    Args:
        store (RunStore): the run; only its ``validate`` output is read.
        config (ExportConfig): format, target, split and card settings.
        context (StageContext): ``force``: export again even when the same export of the same
            input exists; ``allow_stale``: export a stale validate output (the card says so)
            instead of refusing it.

    Returns:
        StageRun: ``manifest.stats`` is an :class:`~grouppref.schemas.reports.ExportReport`,
        ``manifest.outputs["location"]`` where it went.

    Raises:
        StageError: validate has not run, is stale, or nothing is left to export.
        ConfigError: a bad target, or ``--hub`` without a token.
    """
    store.require(INPUT_STAGE)
    stale = require_fresh(store, INPUT_STAGE, allow_stale=context.allow_stale, use="export it")
    # a stale export is another output (its card says so): it joins the cache key
    marker = sha256_text(canonical_json({"stale": stale})) if stale else ""
    stage: StageRun[Any] = store.open_stage(config.stage_name(), config,
                             input_fingerprint=marker, inputs=[INPUT_STAGE], record_type=None,
                             stage_version=STAGE_VERSION, force=context.force)
    if stage.cached:  # before reading RUN/validate: a cached export reads nothing
        return stage
    splits = [s for s in SPLITS if config.split in (None, s)]
    table = stored_table(store)
    key = store.require(INPUT_STAGE).output_fingerprint or ""
    skipped: Counter[str] = Counter()
    rejects: list[Reject] = []
    if table is not None:
        if config.format == "groups":
            dsd = groups_from_table(table, config, key)
        else:
            dsd, skipped, rejects = pairs_from_table(table, config, key)
        column = table.column("split")
        per_split = {s: int(pc.sum(pc.equal(column, s)).as_py() or 0) for s in splits}
    else:
        groups = [g for g in load_validated(store) if config.split in (None, g.split)]
        dsd, skipped, rejects = build_dataset(groups, config, key)
        per_split = {s: sum(g.split == s for g in groups) for s in splits}
    inputs = sum(per_split.values())
    report = ExportReport(format=config.format, target=config.target, location="",
                          rows={s: len(ds) for s, ds in dsd.items()},
                          skipped_pairs=dict(skipped), groups=per_split)
    card = dataset_card(store, dsd, config, report, data_files=data_files(config, dsd),
                        stale={INPUT_STAGE: stale} if stale else None)
    location, files = _write_target(store, dsd, card, config)
    report = report.model_copy(update={"location": location, "files": files})
    stage.add_rejects("export", rejects)
    return stage.finish(inputs=inputs, kept=inputs - len(rejects),
                        stats=report.model_dump(mode="json"), outputs={"location": location})
