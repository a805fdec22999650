"""Where training data comes from, for ``grouppref train`` / ``grouppref eval``. ``DATA`` is one of

* a run directory: its ``RUN/validate`` output (``ValidatedGroup`` rows with their split);
* a dataset saved with ``save_to_disk`` whose rows are ``ValidatedGroup`` records (a
  ``DatasetDict`` contributes every split; a split named test/validation/eval is held out);
* a Hub dataset id of the same shape;
* a local file of such rows (JSONL/JSON/CSV/Parquet, read by :mod:`grouppref.readers.rows`).

A row that is not a valid ``ValidatedGroup`` becomes a reject with its row number and reason;
a source none of whose rows is one is refused in one line (e.g. a prompts dataset).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grouppref.errors import InputFileError, RowError
from grouppref.readers.rows import HUB_ID, iter_rows, to_reject
from grouppref.runs.hashing import fingerprint_file, sha256_text
from grouppref.runs.store import RunStore
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.schemas.arrow import from_row

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


def load_groups(source: str | Path, stage: str = "train") -> GroupSource:
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
    out = GroupSource(source=text, groups=[])
    if Path(text).is_file():  # a file of rows: read as a file, never looked up on the Hub
        for number, row in iter_rows(text):
            out.rows += 1
            got = to_reject(stage, row) if isinstance(row, RowError) else \
                _row_to_group(row, None, text, number, stage)
            (out.rejects if isinstance(got, Reject) else out.groups).append(got)  # type: ignore[arg-type]
    else:
        import datasets

        loaded = _load_dataset(text)
        parts = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [(None, loaded)]
        for split_name, ds in parts:
            for row in ds:
                out.rows += 1
                got = _row_to_group(row, split_name, text, out.rows, stage)
                (out.rejects if isinstance(got, Reject) else out.groups).append(got)  # type: ignore[arg-type]
    if out.rows == 0:
        raise InputFileError(f"{text}: no rows")
    if not out.groups:
        first = out.rejects[0]
        raise InputFileError(f"{text}: none of its {out.rows} rows is a ValidatedGroup (row "
                             f"{first.row}: {first.reason}); {stage} reads a run directory "
                             "(its validate stage) or groups exported by `grouppref export`")
    path = Path(text)
    out.fingerprint = fingerprint_file(path) if path.exists() else sha256_text(f"hub:{text}")
    return out
